# SPDX-License-Identifier: BSD-2-Clause
"""Tests that run inside VMs with soft-RoCE (rxe): one VM (tools/vm/run_in_vm.sh) or two joined
only to each other (tools/vm/run_two_vms.sh). Both are `exclusive` (the VMs emulate the CPU in
software and get the machine's cores to themselves) and tagged `rxe`, which the sanitizer passes
leave out."""

_VM_TAGS = [
    "exclusive",
    "rxe",
]

def cqd_rxe_test(name, binary, srcs, deps):
    """A GoogleTest binary `binary` (statically linked, so that the VM's initramfs needs only
    system libraries), run inside one VM with rxe0 by the sh_test `name`."""
    native.cc_binary(
        name = binary,
        testonly = True,
        srcs = srcs,
        linkstatic = True,
        deps = deps + ["@gtest//:gtest_main"],
    )
    native.sh_test(
        name = name,
        size = "large",
        srcs = ["//tools/vm:vm_test.sh"],
        args = ["$(location :%s)" % binary],
        data = [
            ":" + binary,
            "//tools/vm:run_in_vm",
        ],
        tags = _VM_TAGS,
    )

def cqd_two_hosts_test(name, programs, server, clients, server_extra = [], options = [],
                       host_programs = []):
    """The sh_test `name`: `server` (a command line, run by two_hosts/server_side.sh) in one VM and
    `clients` (command lines run at once by two_hosts/clients.sh) in the other. `programs` are
    the labels of the programs copied into both VMs, `host_programs` the paths of installed ones
    (/usr/bin/rping); `server_extra` are further arguments of server_side.sh; `options` further
    options of run_two_vms.sh. @SERVER in
    a client command line is the server VM's address."""
    native.sh_test(
        name = name,
        size = "large",
        srcs = ["//tools/vm:run_two_vms.sh"],
        args = ["--timeout 600"] +
               ["--with $(location %s)" % p for p in programs] +
               ["--with " + p for p in host_programs] +
               options +
               ["$(location two_hosts/server_side.sh)", "'%s'" % server] +
               ["'%s'" % a for a in server_extra] +
               ["--", "$(location two_hosts/clients.sh)"] +
               ["'%s'" % c for c in clients],
        data = [
            "two_hosts/clients.sh",
            "two_hosts/server_side.sh",
            "//tools/vm:run_two_vms",
        ] + programs,
        tags = _VM_TAGS,
    )
