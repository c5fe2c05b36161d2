// The only C the project has: pick the libfuse API level and pull in the headers.
// FUSE_USE_VERSION 312 exposes fuse_session_loop_mt(se, cfg) with the opaque loop config
// (libfuse >= 3.12; Debian 12 ships 3.14). Keep this definition here and nowhere else.
#define FUSE_USE_VERSION 312
#include <fuse3/fuse_lowlevel.h>
#include <sys/vfs.h>
#include <sys/xattr.h>
