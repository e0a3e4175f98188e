# SPDX-License-Identifier: BSD-2-Clause
"""Offline stand-in for @rules_java: forwards to Bazel 4.2.3's native Java rules."""

def java_import(**attrs):
    native.java_import(**attrs)

def java_runtime(**attrs):
    native.java_runtime(**attrs)

def java_toolchain(**attrs):
    native.java_toolchain(**attrs)
