# SPDX-License-Identifier: BSD-2-Clause
"""A second auto-configured C++ toolchain, with clang-14 as the compiler, for --config=fuzz.

Bazel 4.2.3 configures @local_config_cc from the CC environment variable, so building with
--repo_env=CC=clang-14 would re-run that configuration, and switching between the default (gcc)
and the fuzz build would throw away the other's toolchain, and with it every cached action, each
time. This repository runs the same auto-configuration (cc_autoconf_impl from @bazel_tools) with
the compiler overridden instead, so both toolchains exist side by side and --config=fuzz only
selects this one with --crosstool_top.
"""

load("@bazel_tools//tools/cpp:cc_configure.bzl", "cc_autoconf_impl")

def _clang_cc_autoconf_impl(repository_ctx):
    clang = repository_ctx.which(repository_ctx.attr.compiler)
    if clang == None:
        fail("%s not found: run tools/bootstrap.sh (it installs clang-14)" %
             repository_ctx.attr.compiler)
    cc_autoconf_impl(repository_ctx, overriden_tools = {"gcc": str(clang)})

clang_cc_autoconf = repository_rule(
    implementation = _clang_cc_autoconf_impl,
    attrs = {"compiler": attr.string(default = "clang-14")},
    environ = ["PATH"],
    configure = True,
    local = True,
)
