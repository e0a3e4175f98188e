# SPDX-License-Identifier: BSD-2-Clause
"""cqd_dependencies(): the external repositories cqd's targets name, for any WORKSPACE.

cqd's BUILD files name the system libraries by repository (@ibverbs, @rdmacm, @tbb, ...). In
Bazel 4 (no bzlmod) such a name resolves in the main workspace, so a workspace that builds
@cqd//:cqd must declare them under the same names. cqd's own WORKSPACE and an engine's both call
this macro, the one place they are declared:

    # An engine's WORKSPACE (Bazel 4.2.3, e.g. Debian's bazel-bootstrap; fully offline)
    local_repository(name = "cqd", path = "/path/to/cqd")   # or http_archive(name = "cqd", ...)
    load("@cqd//bazel:deps.bzl", "cqd_dependencies")
    cqd_dependencies()

and the engine's .bazelrc needs `build --cxxopt=-std=c++20` (cqd's headers and sources are
C++20; an engine's build does not read cqd's .bazelrc). The repository must be named "cqd".
"""

def _cqd_vendored_repository_impl(repository_ctx):
    # The folder of `workspace_file`, inside the cqd checkout wherever it is (local_repository,
    # http_archive, the main workspace), linked entry by entry as local_repository would.
    root = repository_ctx.path(repository_ctx.attr.workspace_file).dirname
    for entry in root.readdir():
        repository_ctx.symlink(entry, entry.basename)

_cqd_vendored_repository = repository_rule(
    implementation = _cqd_vendored_repository_impl,
    attrs = {"workspace_file": attr.label(mandatory = True, allow_single_file = True)},
    local = True,
)

# The Debian -dev packages cqd builds against (tools/bootstrap.sh installs them), each a
# new_local_repository rooted at /usr with a build file of third_party/system/.
_SYSTEM_LIBRARIES = [
    "ibverbs",  # libibverbs-dev
    "rdmacm",  # librdmacm-dev
    "tbb",  # libtbb-dev (only @cqd//:cqd_tbb links it)
    "concurrentqueue",  # libconcurrentqueue-dev
    "nlohmann_json",  # nlohmann-json3-dev (cqd's tools and tests)
    "gtest",  # libgtest-dev, libgmock-dev (cqd's tests; an engine's too, if it likes)
    "benchmark",  # libbenchmark-dev (cqd's benchmarks)
]

# Stand-ins, in third_party/bazel/, for what Bazel 4.2.3's implicit WORKSPACE suffix would
# otherwise download (it declares each only if the WORKSPACE has not).
_BAZEL_STUBS = ["rules_cc", "rules_java", "remote_coverage_tools"]

def cqd_dependencies(system_prefix = "/usr"):
    """Declares the repositories cqd's targets need, offline; skips any name already declared.

    Declares, each only if no repository of that name exists yet (native.existing_rule), so that
    a WORKSPACE that declares one itself, before this call, keeps its own:

      ibverbs, rdmacm, tbb, concurrentqueue, nlohmann_json, gtest, benchmark:
          new_local_repository(path = system_prefix) with cqd's build file
          (@cqd//third_party/system:NAME.BUILD). The names are fixed: cqd's BUILD files say
          "@ibverbs", "@tbb", ... and in Bazel 4 those resolve in the main workspace. An engine
          with its own repository of one of these names (its own gtest, say) declares it before
          calling this macro, and cqd's targets then use that one: it must provide the same
          targets (@gtest//:gtest, @gtest//:gtest_main, ...).
      rules_cc, rules_java, remote_coverage_tools:
          the stubs in cqd's third_party/bazel/, found inside the cqd repository by label (no
          path to give: it works with local_repository and http_archive of cqd alike). Bazel
          4.2.3's implicit WORKSPACE suffix would otherwise http_archive them, which fails
          offline. An engine that declares these itself before this call keeps its own.

    Must be called from a WORKSPACE file (after the repository "cqd" is declared and this file
    loaded from it). Nothing is downloaded.

    Args:
      system_prefix: where the Debian -dev packages are installed: the root of each system
        library repository (its build file globs include/... and lib/x86_64-linux-gnu/...
        under it).
    """
    for name in _BAZEL_STUBS:
        if not native.existing_rule(name):
            _cqd_vendored_repository(
                name = name,
                workspace_file = Label("//third_party/bazel/%s:WORKSPACE" % name),
            )
    for name in _SYSTEM_LIBRARIES:
        if not native.existing_rule(name):
            native.new_local_repository(
                name = name,
                build_file = str(Label("//third_party/system:%s.BUILD" % name)),
                path = system_prefix,
            )
