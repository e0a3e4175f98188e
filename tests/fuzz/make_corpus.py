#!/usr/bin/env python3
"""Writes the seed corpus of //tests/fuzz:runtime_fuzz into tests/fuzz/corpus/.

Each seed is 2 configuration bytes and then 3-byte operations (opcode, a, b); runtime_fuzz.cc
documents the encoding. Rerun after changing the encoding:  tests/fuzz/make_corpus.py
"""
import os

OPS = ["CreateCq", "AdoptCq", "DestroyCq", "CreateQp", "RegisterQp", "Unregister", "DestroyQp",
       "Inject", "InjectStray", "Spurious", "FailGetEvent", "FailGetAsyncEvent", "RaiseQpEvent",
       "RaiseDeviceEvent", "EpollDrain", "RawDrain", "GetStats", "Sleep", "Quiesce", "Shutdown"]


def op(name, a=0, b=0):
    return bytes([OPS.index(name), a & 0xff, b & 0xff])


def config(pollers=1, owned=False, edge=False, ack=0, idle=False, batch=3, cap=7, dispatch=6,
           few_regs=False):
    c0 = (pollers - 1) | (owned << 1) | (edge << 2) | (ack << 3) | (idle << 5) | (batch << 6)
    c1 = cap | (dispatch << 3) | (few_regs << 6)
    return bytes([c0, c1])


def cq(shard=0, depth=16, solicited=False):
    return op("CreateCq", shard, (depth - 1) | (solicited << 4))


def qp(recv=0, send=None):  # send=None: the same CQ
    return op("CreateQp", recv, 1 if send is None else send << 1)


def inject(q=0, n=16, send=False, errors=0, solicited=False, overflow=False, unregister=False):
    return op("Inject", q | (send << 3) | ((n - 1) << 4),
              errors | (solicited << 2) | (0x78 if overflow else 0) | (0x80 if unregister else 0))


def reg(q=0, consumer=0):
    return op("RegisterQp", q, consumer)


SEEDS = {
    "basic": config() + cq() + qp() + reg() + inject() * 3 + op("Quiesce"),
    "two_shards_two_consumers": config(pollers=2, owned=True) + cq(0) + cq(1) + qp(0, 1) +
        reg(0, 0) + qp(1) + reg(1, 1) + inject(0) + inject(0, send=True) + inject(1) * 2 +
        op("EpollDrain", 0, 8) + op("Quiesce"),
    "churn": config(owned=True) + cq() + qp() + reg(0, 1) + inject(0, 8) +
        op("Unregister", 0) + inject(0, 8) + reg(0, 0) + inject(0, 8) + op("Unregister", 0) +
        reg(0, 1) + inject(0, 4) + op("DestroyQp", 0) + inject(0, 4) + op("Quiesce"),
    "errors_solicited": config() + cq(0, 16, solicited=True) + qp() + reg() +
        inject(0, 4) + inject(0, 4, errors=1) + inject(0, 4, solicited=True) +
        inject(0, 4, errors=3) + op("Sleep", 0, 50) + op("Quiesce"),
    "adopt_release_readopt": config(pollers=2, owned=True) + op("AdoptCq", 1, 15) + qp(0) +
        reg(0, 0) + inject(0, 8) + op("Unregister", 0) + op("DestroyCq", 0) + inject(0, 8) +
        op("AdoptCq", 1, 0x80) + reg(0, 1) + inject(0, 8) + op("Quiesce"),
    "adopt_wrong_shard": config(pollers=2) + op("AdoptCq", 0x40, 7) + op("AdoptCq", 0, 0x80) +
        qp(0) + reg() + inject(0, 5) + op("Quiesce"),
    "overflow": config() + cq(0, 2) + qp() + reg() + op("Sleep", 0, 1) + inject(0, 2) +
        inject(0, 2) + inject(0, 2, overflow=True) + inject(0, 2, overflow=True) +
        op("GetStats") + op("Quiesce"),
    "faults": config(pollers=2, owned=True, ack=1) + cq(0) + cq(1) + qp(0) + reg(0, 0) +
        qp(1) + reg(1, 1) + op("FailGetEvent", 0, 31) + op("FailGetEvent", 1, 30) +
        op("FailGetAsyncEvent", 0, 21) + inject(0) + inject(1) + op("Spurious", 0) +
        op("Spurious", 1) + op("RaiseQpEvent", 0, 0) + op("RaiseQpEvent", 1, 3) +
        op("RaiseDeviceEvent", 0, 1) + op("EpollDrain", 0, 4) + op("Quiesce"),
    "shutdown_midway": config(owned=True) + cq() + qp() + reg(0, 1) + inject(0, 16) +
        op("Shutdown") + inject(0, 8) + cq() + reg(0, 0) + op("RawDrain", 1, 64) +
        op("RawDrain", 0, 64) + op("GetStats"),
    "device_fatal": config() + cq() + qp() + reg() + inject(0, 8) +
        op("RaiseDeviceEvent", 0xfd, 0xfd) + inject(0, 8) + cq() + op("Quiesce"),
    "backpressure": config(owned=True, cap=0, dispatch=0, batch=0) + cq(0, 16) + qp() +
        reg(0, 1) + qp() + reg(1, 0) + (inject(0, 16) + inject(1, 16)) * 4 +
        op("EpollDrain", 0, 1) + op("Quiesce"),
    "bad_input": config(owned=True, few_regs=True) + op("CreateCq", 0x80, 3) + cq() +
        qp() + reg(0, 0x80) + reg(0, 0) + reg(0, 1) + qp() + reg(1, 1) + qp() + reg(2, 0) +
        qp() + reg(3, 1) + op("RawDrain", 0, 5) + op("RawDrain", 2, 5) + inject(3, 3) +
        op("Quiesce"),
    "destroy_cq_rules": config() + cq() + qp() + reg() + inject(0, 4) + op("DestroyCq", 0) +
        op("Unregister", 0) + op("DestroyCq", 0) + inject(0, 4) + op("DestroyQp", 0) +
        op("DestroyCq", 0) + op("GetStats"),
    "edge_triggered": config(edge=True, ack=2) + cq() + qp() + reg() + inject(0, 16) +
        op("EpollDrain", 0, 1) + op("EpollDrain", 0, 2) + inject(0, 16) +
        op("EpollDrain", 0, 3) + op("RawDrain", 0, 1) + op("Quiesce"),
    "strays": config(pollers=2) + cq(0) + cq(1) + op("InjectStray", 0x30, 0) +
        op("InjectStray", 0x71, 1) + qp(0) + inject(0, 4) + reg() + inject(0, 4) +
        op("Quiesce"),
    "ack_threshold_one": config(ack=0, idle=True) + cq() + qp() + reg() + op("Spurious", 0) +
        op("Sleep", 0, 100) + inject(0, 1) + op("Sleep", 0, 100) + op("Spurious", 0) +
        op("Quiesce") + op("Unregister", 0) + op("DestroyQp", 0) + op("DestroyCq", 0) +
        op("GetStats"),
    "two_pollers_batch_one": config(pollers=2, owned=True, edge=True, idle=True, batch=0) +
        cq(0) + cq(1) + qp(0, 1) + reg(0, 1) + qp(1, 0) + reg(1, 0) +
        (inject(0, 3) + inject(0, 3, send=True) + inject(1, 3) + inject(1, 3, send=True)) * 3 +
        op("Quiesce"),
    "self_unregister": config(owned=True) + cq() + qp() + reg(0, 0) + qp() + reg(1, 1) +
        inject(0, 8, unregister=True) + inject(1, 8, unregister=True) + inject(0, 4) +
        inject(1, 4) + op("EpollDrain", 0, 64) + reg(0, 1) + reg(1, 0) +
        inject(0, 4, unregister=True) + inject(1, 4) + op("Quiesce"),
}

if __name__ == "__main__":
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
    os.makedirs(out, exist_ok=True)
    for old in os.listdir(out):
        os.remove(os.path.join(out, old))
    for name, data in SEEDS.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    print(f"wrote {len(SEEDS)} seeds to {out}")
