# SPDX-License-Identifier: BSD-2-Clause
"""A libFuzzer target and its corpus replay test, from one library that defines
LLVMFuzzerTestOneInput."""

def cqd_fuzz_target(name, lib, corpus, testonly = False):
    """Defines `name` and `name`_corpus_test.

    Under --config=fuzz (define cqd_fuzz=1, matched by :fuzzing) `name` is a libFuzzer binary; in
    every other config it is the replay driver (replay_main.cc), which runs the inputs named on
    its command line once. `name`_corpus_test replays `corpus` (a filegroup) in every config.
    """
    native.cc_binary(
        name = name,
        testonly = testonly,
        srcs = select({
            ":fuzzing": [],
            "//conditions:default": ["replay_main.cc"],
        }),
        linkopts = select({
            ":fuzzing": ["-fsanitize=fuzzer"],
            "//conditions:default": [],
        }),
        deps = [lib],
    )
    native.cc_test(
        name = name + "_corpus_test",
        size = "small",
        srcs = ["replay_main.cc"],
        args = ["$(locations %s)" % corpus],
        data = [corpus],
        deps = [lib],
    )
