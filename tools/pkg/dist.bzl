# SPDX-License-Identifier: BSD-2-Clause
"""cqd_dist: the install tree of //:cqd for engines that do not build with Bazel.

Lays out, under bazel-bin/<package>/<name>/:

  lib/libcqd.a             every object file of the cc_library targets of this workspace that
                           `deps` link (today those of //:cqd); a new
                           runtime .cc file, or a new cc_library //:cqd depends on, is picked up
                           without editing this rule
  lib/pkgconfig/cqd.pc     pkg-config file; prefix=${pcfiledir}/../.., so the tree is relocatable
                           (tools/install.sh writes the real prefix instead)
  include/cqd/*.h          the public headers (`hdrs`)
  cmake/*.cmake.in         the CMake package config's templates (`cmake_templates`)
  shared/libcqd.so         the same objects as a shared library: soname libcqd.so.MAJOR (0.x:
                           libcqd.so.0.MINOR), only
                           what `version_script` names exported (not made in sanitizer builds,
                           nor where shared_library is False), linked with --linkopt too

A layer above the library (//:cqd_tbb_dist: libcqd_tbb.a, cqd-tbb.pc, cqd/tbb.h) names the
library in exclude_deps, so that it carries only its own objects, and requires it by name
(pc_requires).

and, beside it, <name>.link_flags: the -fsanitize=... link options of the build configuration
(empty in a plain build), which a consumer of a sanitizer build's libcqd.a must link with too.

The pkg-config requirements come from the link flags of `deps` (CcInfo user_link_flags): a flag
named in `pc_modules` (e.g. -libverbs) becomes that module in Requires, any other flag (e.g.
-pthread) goes to Libs. So when runtime code starts linking @rdmacm (-lrdmacm), cqd.pc requires
librdmacm without an edit here. Static libraries of other workspaces (@foo with .a srcs) cannot
be folded in and fail the build.

libcqd.a is a static library only, so its dependencies are needed by every link, not only a
--static one: they go in Requires and Libs, not in Requires.private / Libs.private. Both
`pkg-config --libs cqd` and `pkg-config --libs --static cqd` link.
"""

load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain")

def _library_objects(lib):
    # Prefer position-independent objects: Debian's g++ links PIE executables by default.
    objects = lib.pic_objects or lib.objects
    if objects:
        return objects
    archive = lib.pic_static_library or lib.static_library
    if archive:
        fail("cqd_dist: %s has a static library but no object files" % archive.path)
    return []

def _cqd_dist_impl(ctx):
    cc_toolchain = find_cpp_toolchain(ctx)
    prefix = ctx.label.name + "/"

    # What exclude_deps link (another dist's library, which this one's users link too) stays out.
    excluded = {}
    for dep in ctx.attr.exclude_deps:
        for linker_input in dep[CcInfo].linking_context.linker_inputs.to_list():
            excluded[str(linker_input.owner)] = True

    objects = []
    link_flags = []
    for dep in ctx.attr.deps:
        for linker_input in dep[CcInfo].linking_context.linker_inputs.to_list():
            if str(linker_input.owner) in excluded:
                continue
            for flag in linker_input.user_link_flags:
                if flag not in link_flags:
                    link_flags.append(flag)
            for lib in linker_input.libraries:
                if linker_input.owner.workspace_name != "":
                    if lib.static_library or lib.pic_static_library or lib.objects or lib.pic_objects:
                        fail("cqd_dist: %s is a static library of another workspace; libcqd.a " %
                             linker_input.owner + "cannot carry it (link it as a system library)")
                    continue
                for obj in _library_objects(lib):
                    if obj not in objects:
                        objects.append(obj)
    if not objects:
        fail("cqd_dist: no object files found in deps")

    # lib/libcqd.a: q appends without replacing members of equal basename; s writes the index;
    # D keeps it deterministic.
    archive = ctx.actions.declare_file(prefix + "lib/lib%s.a" % ctx.attr.library_name)
    args = ctx.actions.args()
    args.add("qcsD")
    args.add(archive)
    args.add_all(objects)
    ctx.actions.run(
        executable = cc_toolchain.ar_executable,
        arguments = [args],
        inputs = depset(objects, transitive = [cc_toolchain.all_files]),
        outputs = [archive],
        mnemonic = "CqdArchive",
        progress_message = "Archiving %s" % archive.short_path,
    )

    # shared/libcqd.so: the same objects as one shared library, exporting only what the version
    # script names; its soname is libcqd.so.MAJOR, or libcqd.so.0.MINOR while MAJOR is 0 (from
    # the version header). Not under lib/, so that -lcqd in the uninstalled tree keeps linking
    # the archive; tools/install.sh installs it as libcqd.so.X.Y.Z with the soname's link and
    # libcqd.so. Sanitizer builds make none:
    # their objects need the sanitizer's runtime in the executable, not in a library.
    sanitizers = [f for f in ctx.fragments.cpp.linkopts if f.startswith("-fsanitize=")]
    shared = []
    if not sanitizers and ctx.attr.shared_library:
        so = ctx.actions.declare_file(prefix + "shared/lib%s.so" % ctx.attr.library_name)
        so_args = ctx.actions.args()
        so_args.add_all([cc_toolchain.compiler_executable, ctx.file.version_header, so,
                         ctx.file.version_script, ctx.attr.library_name])
        so_args.add_all(objects)
        so_args.add("--")
        so_args.add_all(link_flags)
        so_args.add_all(ctx.fragments.cpp.linkopts)  # --linkopt (a packager's -Wl,-z,relro)
        ctx.actions.run_shell(
            inputs = depset(objects + [ctx.file.version_header, ctx.file.version_script],
                            transitive = [cc_toolchain.all_files]),
            outputs = [so],
            arguments = [so_args],
            command = """set -eu
export PATH="/usr/bin:/bin:${PATH:-}"  # the compiler driver finds ld there
cc=$1 header=$2 out=$3 map=$4 name=$5; shift 5
objects=(); while [ "$1" != -- ]; do objects+=("$1"); shift; done; shift
major=$(sed -n 's/^#define CQD_VERSION_MAJOR \\([0-9][0-9]*\\)$/\\1/p' "$header")
minor=$(sed -n 's/^#define CQD_VERSION_MINOR \\([0-9][0-9]*\\)$/\\1/p' "$header")
test -n "$major" && test -n "$minor"
# While MAJOR is 0 a MINOR step may change the ABI: the soname carries both.
if [ "$major" = 0 ]; then soversion=0.$minor; else soversion=$major; fi
"$cc" -shared -o "$out" -Wl,-soname,lib$name.so.$soversion -Wl,--version-script="$map" \
  -Wl,--no-undefined -Wl,--as-needed "${objects[@]}" "$@" -lstdc++ -lm
""",
            mnemonic = "CqdSharedLibrary",
            progress_message = "Linking %s" % so.short_path,
        )
        shared.append(so)

    # lib/pkgconfig/cqd.pc
    requires = list(ctx.attr.pc_requires)
    libs = []
    for flag in link_flags:
        module = ctx.attr.pc_modules.get(flag)
        if module:
            if module not in requires:
                requires.append(module)
        else:
            libs.append(flag)
    pc_template = ctx.actions.declare_file(ctx.label.name + ".pc.in")
    ctx.actions.write(pc_template, "\n".join([
        "prefix=${pcfiledir}/../..",
        "exec_prefix=${prefix}",
        "libdir=${exec_prefix}/lib",
        "includedir=${prefix}/include",
        "",
        "Name: %s" % (ctx.attr.pc_name or ctx.attr.library_name),
        "Description: %s" % ctx.attr.description,
        "Version: @VERSION@",
        "Requires: %s" % ", ".join(requires),
        "Libs: %s" % " ".join(["-L${libdir}", "-l" + ctx.attr.library_name] + libs),
        "Cflags: -I${includedir}",
        "",
    ]))

    # The version comes from the one place it is defined: the header's CQD_VERSION_STRING.
    pc = ctx.actions.declare_file(prefix + "lib/pkgconfig/%s.pc" %
                                                (ctx.attr.pc_name or ctx.attr.library_name))
    ctx.actions.run_shell(
        inputs = [pc_template, ctx.file.version_header],
        outputs = [pc],
        command = ("v=$(sed -n 's/^#define CQD_VERSION_STRING \"\\(.*\\)\"$/\\1/p' \"$1\") && " +
                   "test -n \"$v\" && sed \"s/@VERSION@/$v/\" \"$2\" > \"$3\""),
        arguments = [ctx.file.version_header.path, pc_template.path, pc.path],
        mnemonic = "CqdPkgConfig",
        progress_message = "Writing %s" % pc.short_path,
    )

    # include/<prefix>/*.h
    headers = []
    for hdr in ctx.files.hdrs:
        out = ctx.actions.declare_file(prefix + "include/%s/%s" % (ctx.attr.include_dir, hdr.basename))
        ctx.actions.symlink(output = out, target_file = hdr)
        headers.append(out)

    # <name>.link_flags: what a consumer of this configuration's objects must link with.
    flags = ctx.actions.declare_file(ctx.label.name + ".link_flags")
    ctx.actions.write(flags, " ".join(sanitizers) + "\n")

    # cmake/*.cmake.in: the CMake package's templates, which tools/install.sh fills in.
    cmake = []
    for template in ctx.files.cmake_templates:
        out = ctx.actions.declare_file(prefix + "cmake/" + template.basename)
        ctx.actions.symlink(output = out, target_file = template)
        cmake.append(out)

    files = [archive, pc] + shared + headers + cmake
    return [DefaultInfo(
        files = depset(files + [flags]),
        runfiles = ctx.runfiles(files = files + [flags]),
    )]

cqd_dist = rule(
    implementation = _cqd_dist_impl,
    doc = "The install tree (lib/, lib/pkgconfig/, include/) of a cc_library; see the file comment.",
    attrs = {
        "deps": attr.label_list(providers = [CcInfo], mandatory = True),
        "hdrs": attr.label_list(allow_files = [".h"], mandatory = True),
        "library_name": attr.string(mandatory = True),
        "include_dir": attr.string(mandatory = True),
        # The header that defines CQD_VERSION_STRING (cqd/version.h).
        "version_header": attr.label(allow_single_file = [".h"], mandatory = True),
        # The CMake package's templates (cqdConfig.cmake.in, cqdConfigVersion.cmake.in).
        "cmake_templates": attr.label_list(allow_files = [".in"]),
        # The linker version script of the shared library: what it exports.
        "version_script": attr.label(allow_single_file = [".map"]),
        # False: the static library only (the oneTBB layer, linked into engines that use it).
        "shared_library": attr.bool(default = True),
        # Libraries the users of this one link anyway (a layer's base): their objects and link
        # flags stay out of it, and pc_requires names them instead.
        "exclude_deps": attr.label_list(providers = [CcInfo]),
        # The .pc file's name (default: library_name) and modules it requires besides the deps'.
        "pc_name": attr.string(),
        "pc_requires": attr.string_list(),
        "description": attr.string(mandatory = True),
        # Link flag -> pkg-config module that provides it.
        "pc_modules": attr.string_dict(),
        "_cc_toolchain": attr.label(default = "@bazel_tools//tools/cpp:current_cc_toolchain"),
    },
    fragments = ["cpp"],
    toolchains = ["@bazel_tools//tools/cpp:toolchain_type"],
    incompatible_use_toolchain_transition = True,
)
