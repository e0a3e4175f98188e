#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-2-Clause
"""Writes the seed corpus of //tests/fuzz:runtime_fuzz into tests/fuzz/corpus/, replacing what it
wrote before and keeping the seeds fuzzing found (FOUND).

Each seed is 3 configuration bytes and then 3-byte operations (opcode, a, b); runtime_fuzz.cc
documents the encoding. Rerun after changing the encoding:  tests/fuzz/make_corpus.py
"""
import os

OPS = ["CreateCq", "AdoptCq", "DestroyCq", "CreateQp", "RegisterQp", "Unregister", "DestroyQp",
       "Inject", "InjectStray", "Spurious", "FailGetEvent", "FailGetAsyncEvent", "RaiseQpEvent",
       "RaiseDeviceEvent", "EpollDrain", "RawDrain", "GetStats", "Sleep", "Quiesce", "Shutdown",
       "TeardownQp", "FailRequestNotify", "BadHandles"]
SPILLS = [1, 2, 8, 4096]
WRS = [0, 1, 2, 3, 4, 8, 16]            # CreateQp's max_send_wr / max_recv_wr choices
QP_OPTS = [-1, 0, 1, 2, 4, 16, -2]      # RegisterQp's QpOptions choices (-2: invalid)


def op(name, a=0, b=0):
    return bytes([OPS.index(name), a & 0xff, b & 0xff])


def config(pollers=1, owned=False, edge=False, ack=0, idle=False, batch=3, cap=7, dispatch=6,
           few_regs=False, spill=4096, no_last_wqe=False, fatal_at_end=False, rtc=False,
           engine_shard=False, arena=False):
    c0 = (pollers - 1) | (owned << 1) | (edge << 2) | (ack << 3) | (idle << 5) | (batch << 6)
    c1 = cap | (dispatch << 3) | (few_regs << 6)
    c2 = SPILLS.index(spill) | (no_last_wqe << 2) | (fatal_at_end << 3) | (rtc << 4) | (
        engine_shard << 5) | (arena << 6)
    return bytes([c0, c1, c2])


def cq(shard=0, depth=16, solicited=False, grow=True):
    return op("CreateCq", shard, (depth - 1) | (solicited << 4) | ((not grow) << 5))


def qp(recv=0, send=None, srq=False, send_wr=0, recv_wr=0):  # send=None: the same CQ
    a = recv | (WRS.index(recv_wr) << 2)
    b = (1 if send is None else send << 1) | (srq << 3) | (WRS.index(send_wr) << 4)
    return op("CreateQp", a, b)


def inject(q=0, n=15, send=False, errors=0, solicited=False, overflow=False, unregister=False):
    assert n % 2 == 1 and 1 <= n <= 15, "n is 1, 3, ..., 15"
    return op("Inject", q | (send << 4) | ((n - 1) // 2 << 5),
              errors | (solicited << 2) | (0x78 if overflow else 0) | (0x80 if unregister else 0))


def reg(q=0, consumer=0, send_wrs=-1, recv_wrs=-1, bad_consumer=False):
    return op("RegisterQp", q, (consumer & 1) | (QP_OPTS.index(send_wrs) << 1) |
              (QP_OPTS.index(recv_wrs) << 4) | (0x80 if bad_consumer else 0))


TIMEOUTS = [1, 20, 2000]
GRACES = [0, 1, 5, 200]
WAITS = {"drain": 0, "no_drain": 1, "pending": 2}


def teardown(q=0, timeout=2000, grace=5, wait="drain", replace=False, on_done=False,
             unregistered_too=False, wait_in_on_done=False):
    a = q | (unregistered_too << 4) | (replace << 5) | (on_done << 6)
    b = (TIMEOUTS.index(timeout) | (GRACES.index(grace) << 2) | (WAITS[wait] << 4) |
         (wait_in_on_done << 6))
    return op("TeardownQp", a, b)


SEEDS = {
    "basic": config() + cq() + qp() + reg() + inject() * 3 + op("Quiesce"),
    "two_shards_two_consumers": config(pollers=2, owned=True) + cq(0) + cq(1) + qp(0, 1) +
        reg(0, 0) + qp(1) + reg(1, 1) + inject(0) + inject(0, send=True) + inject(1) * 2 +
        op("EpollDrain", 0, 8) + op("Quiesce"),
    "churn": config(owned=True) + cq() + qp() + reg(0, 1) + inject(0, 7) +
        op("Unregister", 0) + inject(0, 7) + reg(0, 0) + inject(0, 7) + op("Unregister", 0) +
        reg(0, 1) + inject(0, 3) + op("Unregister", 0) + op("DestroyQp", 0) + inject(0, 3) +
        qp() + inject(1, 3) + reg(1, 1) + inject(0, 3) + inject(1, 3) + op("Quiesce"),
    "errors_solicited": config() + cq(0, 16, solicited=True) + qp() + reg() +
        inject(0, 3) + inject(0, 3, errors=1) + inject(0, 3, solicited=True) +
        inject(0, 3, errors=3) + op("Sleep", 0, 50) + op("Quiesce"),
    "adopt_release_readopt": config(pollers=2, owned=True) + op("AdoptCq", 1, 15) + qp(0) +
        reg(0, 0) + inject(0, 7) + op("Unregister", 0) + op("DestroyCq", 0) + inject(0, 7) +
        op("AdoptCq", 1, 0x80) + reg(0, 1) + inject(0, 7) + op("BadHandles", 0, 0) +
        op("Quiesce"),
    "adopt_wrong_shard": config(pollers=2) + op("AdoptCq", 0x40, 7) + op("AdoptCq", 0, 0x80) +
        qp(0) + reg() + inject(0, 5) + op("Quiesce"),
    "overflow": config() + cq(0, 2, grow=False) + qp() + reg() + op("Sleep", 0, 1) +
        inject(0, 1) + inject(0, 1) + inject(0, 3, overflow=True) +
        inject(0, 3, overflow=True) + op("GetStats") + op("Quiesce"),
    "faults": config(pollers=2, owned=True, ack=1) + cq(0) + cq(1) + qp(0) + reg(0, 0) +
        qp(1) + reg(1, 1) + op("FailGetEvent", 0, 31) + op("FailGetEvent", 1, 30) +
        op("FailGetAsyncEvent", 0, 21) + op("FailRequestNotify", 0, 0x7d) +
        op("FailRequestNotify", 1, 0x3e) + inject(0) + inject(1) + op("Spurious", 0) +
        op("Spurious", 1) + op("RaiseQpEvent", 0, 0) + op("RaiseQpEvent", 1, 3) +
        op("RaiseDeviceEvent", 0, 1) + op("EpollDrain", 0, 4) + op("Quiesce"),
    "shutdown_midway": config(owned=True) + cq() + qp() + reg(0, 1) + inject(0, 15) +
        teardown(0, wait="pending") + op("Shutdown") + inject(0, 7) + cq() + reg(0, 0) +
        op("RawDrain", 1, 64) + op("RawDrain", 0, 64) + op("GetStats") +
        op("BadHandles", 1, 1),
    "device_fatal": config() + cq() + qp() + reg() + inject(0, 7) +
        op("RaiseDeviceEvent", 0xfd, 0xfd) + inject(0, 7) + cq() + teardown(0) +
        op("Quiesce"),
    "backpressure": config(owned=True, cap=0, dispatch=0, batch=0, spill=1) + cq(0, 16) + qp() +
        reg(0, 1) + qp() + reg(1, 0) + (inject(0, 15) + inject(1, 15)) * 4 +
        op("EpollDrain", 0, 1) + op("GetStats") + op("Quiesce"),
    "bad_input": config(owned=True, few_regs=True) + op("CreateCq", 0x80, 3) + cq() +
        qp() + reg(0, 0, bad_consumer=True) + reg(0, 0) + reg(0, 1) + qp() + reg(1, 1) + qp() +
        reg(2, 0) + qp() + reg(3, 1) + reg(3, 1, send_wrs=-2) + op("RawDrain", 0, 5) +
        op("RawDrain", 2, 5) + inject(3, 3) + teardown(5, unregistered_too=True) +
        op("BadHandles", 0, 1) + op("Quiesce"),
    "destroy_cq_rules": config() + cq() + qp() + reg() + inject(0, 3) + op("DestroyCq", 0) +
        op("Unregister", 0) + op("DestroyCq", 0) + inject(0, 3) + op("DestroyQp", 0) +
        op("DestroyCq", 0) + op("BadHandles", 0, 0) + op("GetStats"),
    "edge_triggered": config(edge=True, ack=2) + cq() + qp() + reg() + inject(0, 15) +
        op("EpollDrain", 0, 1) + op("EpollDrain", 0, 2) + inject(0, 15) +
        op("EpollDrain", 0, 3) + op("RawDrain", 0, 1) + op("Quiesce"),
    "strays": config(pollers=2) + cq(0) + cq(1) + op("InjectStray", 0x30, 0) +
        op("InjectStray", 0x71, 1) + qp(0) + inject(0, 3) + reg() + inject(0, 3) +
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
        inject(0, 7, unregister=True) + inject(1, 7, unregister=True) + inject(0, 3) +
        inject(1, 3) + op("EpollDrain", 0, 64) + reg(0, 1) + reg(1, 0) +
        inject(0, 3, unregister=True) + inject(1, 3) + op("Quiesce"),
    # Teardowns: drained, then the QP destroyed and a new one with the same qp_num registered.
    "teardown_reuse": config(pollers=2, owned=True) + cq(0) + cq(1) + qp(0, 1, send_wr=4,
        recv_wr=4) + reg(0, 1) + inject(0, 7) + inject(0, 7, send=True) +
        teardown(0, replace=True, on_done=True) + inject(1, 7) + inject(1, 7, send=True) +
        teardown(1, wait="pending", replace=True) + op("Quiesce") + inject(1, 3) +
        op("Quiesce"),
    "teardown_no_drain": config(owned=True) + cq(0) + qp(send_wr=8, recv_wr=8) + reg(0, 1) +
        qp(send_wr=8, recv_wr=8) + reg(1, 0) + inject(0, 7) + inject(1, 7) +
        teardown(0, timeout=20, wait="no_drain") +
        teardown(1, timeout=20, wait="no_drain", on_done=True) + op("Quiesce"),
    "teardown_short_timeouts": config(pollers=2, cap=1, spill=2) + cq(0) + cq(1) +
        qp(0, 1, send_wr=16, recv_wr=16) + reg(0) + qp(1, send_wr=16, recv_wr=8) + reg(1) +
        (inject(0, 7) + inject(0, 7, send=True)) * 2 + inject(1, 15) + teardown(0, timeout=1) +
        teardown(1, timeout=20, wait="pending", on_done=True) + op("EpollDrain", 0, 64) +
        op("Quiesce"),
    "teardown_srq_last_wqe": config(pollers=2, owned=True) + cq(0) + cq(1) +
        qp(0, 1, srq=True, send_wr=8) + reg(0, 1) + inject(0, 7) + inject(0, 7, send=True) +
        op("RaiseQpEvent", 0, 7) + teardown(0, grace=200, replace=True) + op("Quiesce"),
    "teardown_srq_rxe": config(pollers=2, owned=True, no_last_wqe=True) + cq(0) + cq(1) +
        qp(0, 1, srq=True) + reg(0, 0) + inject(0, 7) + inject(0, 7, send=True) +
        teardown(0, grace=1, replace=True, on_done=True) + qp(1, 0, srq=True) + reg(2, 1) +
        inject(2, 5) + teardown(2, grace=0, wait="pending") + op("Quiesce"),
    "teardown_full_cq": config() + cq(0, 4, grow=False) + qp() + reg(0, 0, 0, 0) +
        inject(0, 3) + inject(0, 1) + teardown(0) + op("Quiesce") + teardown(0) +
        op("Unregister", 0) + op("GetStats"),
    "capacity_guard": config(owned=True) + cq(0, 4, grow=False) + cq(0, 2) +
        qp(0, send_wr=2, recv_wr=2) + reg(0) + reg(0, 0, 0, 0) + qp(0) + reg(1, 1, 1, 0) +
        qp(1, send_wr=16, recv_wr=16) + reg(2, 1) + qp(1, 0) + reg(3, 0, 16, 16) +
        inject(2, 15) + inject(3, 15) + op("Quiesce"),
    "spill_stall": config(pollers=2, owned=True, cap=0, dispatch=2, spill=1) + cq(0) + cq(1) +
        qp(0) + reg(0, 1) + qp(0) + reg(1, 0) + qp(1, 0) + reg(2, 1) +
        (inject(0, 15) + inject(1, 15) + inject(2, 15) + inject(2, 15, send=True)) * 3 +
        op("GetStats") + op("Unregister", 0) + op("GetStats") + op("Quiesce"),
    "event_order": config(pollers=2, owned=True) + cq(0) + cq(1) + qp(0, 1) + reg(0, 1) +
        qp(1) + reg(1, 0) + inject(0, 15) + inject(0, 15, send=True) + op("RaiseQpEvent", 0, 3) +
        inject(0, 7) + op("RaiseQpEvent", 0, 0) + inject(1, 15) + op("RaiseQpEvent", 1, 1) +
        inject(1, 7) + op("EpollDrain", 0, 3) + op("RaiseQpEvent", 1, 4) + op("Quiesce"),
    "fatal_at_end": config(pollers=2, owned=True, fatal_at_end=True) + cq(0) + cq(1) +
        qp(0, 1, send_wr=16, recv_wr=16) + reg(0, 1) + qp(1, send_wr=8, recv_wr=8) + reg(1, 0) +
        qp(0) + reg(2, 1) + inject(0, 15) + inject(1, 7) + inject(2, 3) +
        teardown(1, wait="pending") + op("Sleep", 0, 10),
    "teardown_pending_churn": config(pollers=2, owned=True, cap=2, spill=8) + cq(0) + cq(1) +
        qp(0, 1, send_wr=8, recv_wr=8) + reg(0, 1) + qp(1, 0, send_wr=8, recv_wr=8) +
        reg(1, 0) + inject(0, 7) + inject(0, 7, send=True) + inject(1, 7) +
        inject(1, 7, send=True) + op("RaiseQpEvent", 0, 3) + op("RaiseQpEvent", 1, 1) +
        teardown(0, timeout=2000, wait="pending", on_done=True) +
        teardown(1, timeout=1, wait="pending") + op("RegisterQp", 0, 1) + op("DestroyQp", 0) +
        op("EpollDrain", 0, 64) + op("Quiesce") + op("DestroyQp", 0) + op("DestroyQp", 1) +
        qp(0, 1, send_wr=8, recv_wr=8) + reg(2, 1) + qp(1, 0) + reg(3, 0) + inject(2, 7) +
        inject(3, 7) + op("Quiesce"),
    # A deadline passes while a stalled consumer holds the CQ back; the QP is replaced at once
    # (the new one gets its qp_num on the same CQ) and must get none of what the old one left.
    "teardown_held_back_reuse": config(owned=True, cap=1, spill=1) + cq(0) +
        qp(send_wr=8, recv_wr=8) + qp(send_wr=8, recv_wr=8) + reg(0, 1) + reg(1, 1) +
        inject(1, 7) + inject(0, 5) + inject(0, 3, send=True) +
        teardown(0, timeout=20, wait="no_drain", replace=True) + inject(2, 5) +
        op("Unregister", 1) + op("Quiesce"),
    # DEVICE_FATAL while a teardown waits for a consumer that is not drained.
    "teardown_fatal_midway": config(owned=True) + cq(0) + qp() + reg(0, 1) + inject(0, 7) +
        teardown(0, wait="pending", on_done=True) + op("RaiseDeviceEvent", 0xfd, 0xfd) +
        op("Quiesce"),
    # Handlers of each kind (and on_done) try Teardown::Wait while teardowns run.
    "teardown_handler_waits": config(pollers=2, owned=True) + cq(0) + cq(1) + qp(0) + qp(1) +
        qp(0) + reg(0, 0) + reg(1, 1) + reg(2, 0) + teardown(2, wait="pending") +
        inject(0, 15) * 3 + inject(1, 15) * 3 +
        teardown(1, wait="pending", on_done=True, wait_in_on_done=True) +
        op("EpollDrain", 0, 64) + op("Quiesce"),
    # Shutdown while another thread waits for a teardown nobody drains.
    "teardown_shutdown_waiting": config(owned=True) + cq(0) + qp() + reg(0, 1) + inject(0, 7) +
        teardown(0, wait="pending") + op("Shutdown") + op("Quiesce"),
    # Found by the fuzzer (a teardown replaced before the harness settled it), kept as it was.
    "teardown_replaced_before_settled": bytes.fromhex(
        "c3370300000f00010f40120000000000000003104204003e006400077000146061380300000fffff"
        "c32a0000000000010f0303104204000107c1c1c1600007700014600a076100077100530000ffffff"
        "1d07f3f3f3e000"),
}

# Inputs that reproduce runtime bugs (tests/fuzz/repros/NAME.input; they fail until it is fixed):
#   bazel run //tests/fuzz:runtime_fuzz -- $PWD/tests/fuzz/repros/NAME.input
REPRO_INPUTS = {
    # Leftovers of a destroyed QP in a released CQ reach the QP that reuses its qp_num on another
    # CQ (repros/stale_cq_queue_bound.cc): queue_capacity 2 is exceeded before any Shutdown.
    "stale_cq_queue_bound": config(pollers=2, cap=1, spill=1) + op("AdoptCq", 0, 15) + cq(1) +
        qp(0) + op("DestroyCq", 0) + inject(0, 7) + op("DestroyQp", 0) + qp(1) +
        reg(1, 0) + op("AdoptCq", 0, 0x80) + op("Sleep", 0, 250) + op("GetStats") +
        op("Quiesce"),
}

# Seeds that fuzzing found, kept in corpus/ as they came (docs/runs names each): not written here,
# and not removed with the written ones.
FOUND = {"handler_unregisters_while_its_shard_stops"}

if __name__ == "__main__":
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
    os.makedirs(out, exist_ok=True)
    for old in os.listdir(out):
        if old not in FOUND:
            os.remove(os.path.join(out, old))
    written = 0
    for name, data in SEEDS.items():
        variants = {name: data}
        if data[0] & 2:  # two consumers: the same program with the other one run to completion
            variants[name + "_rtc"] = data[:2] + bytes([data[2] | 0x10]) + data[3:]
            # ... and on shard 0 driven by the fuzzer's reactor thread (engine_shards)
            variants[name + "_rtc_shard"] = data[:2] + bytes([data[2] | 0x30]) + data[3:]
        else:  # shard 0 engine-driven; the engine consumer in a oneTBB arena
            variants[name + "_shard"] = data[:2] + bytes([data[2] | 0x20]) + data[3:]
            variants[name + "_arena"] = data[:2] + bytes([data[2] | 0x40]) + data[3:]
            # ... with the longest linger (config[1] and config[2]'s high bits)
            variants[name + "_arena_linger10ms"] = (
                data[:1] + bytes([data[1] | 0x80, data[2] | 0xc0]) + data[3:])
        for variant, bytes_ in variants.items():
            with open(os.path.join(out, variant), "wb") as f:
                f.write(bytes_)
            written += 1
    print(f"wrote {written} seeds to {out}")
    repros = os.path.join(os.path.dirname(os.path.abspath(__file__)), "repros")
    for name, data in REPRO_INPUTS.items():
        with open(os.path.join(repros, name + ".input"), "wb") as f:
            f.write(data)
    print(f"wrote {len(REPRO_INPUTS)} repro inputs to {repros}")
