"""cqd's version: the one place it is defined (cqd.pc's Version, tools/install.sh, the tests)."""

CQD_VERSION = "0.1.0"
