// SPDX-License-Identifier: BSD-2-Clause
// examples/blockd/protocol.h: the wire format between blockd_server and blockd_client, and the
// part of rping's (Debian rdmacm-utils) that the server speaks too.
//
// blockd: the client connects with kHello as private data; the server's accept carries Geometry.
// A request is one SEND of a Request. The data moves by RDMA: for kRead the server RDMA WRITEs
// the blocks into the client's buffer with IMMEDIATE = the request's tag; for kWrite it RDMA
// READs them from the client's buffer and then sends a zero-length RDMA WRITE WITH IMMEDIATE =
// tag. A refused request (out of range) is answered with tag | kRefused. Integers are
// little-endian (both ends are this code).
//
// rping: a client that connects without kHello. It SENDs an RpingInfo naming its source buffer;
// the server RDMA READs it, SENDs a 16-byte "go ahead", receives an RpingInfo naming the sink,
// RDMA WRITEs the data there (up to and including its first NUL), and SENDs "go ahead" again;
// repeated until the client disconnects. RpingInfo fields are big-endian.
#ifndef CQD_EXAMPLES_BLOCKD_PROTOCOL_H_
#define CQD_EXAMPLES_BLOCKD_PROTOCOL_H_

#include <cstdint>

namespace cqd::examples::blockd {

inline constexpr char kHello[] = "cqd-blockd/1";
inline constexpr uint32_t kMagic = 0x42445143;  // "CQDB"
inline constexpr uint32_t kRefused = 0x80000000u;
inline constexpr uint32_t kMaxBlocksPerRequest = 16;

enum Op : uint8_t { kRead = 1, kWrite = 2 };

struct Geometry {
  uint32_t magic;
  uint32_t block_size;
  uint64_t blocks;
};

struct Request {
  uint32_t magic;
  uint8_t op;
  uint8_t pad[3];
  uint32_t tag;    // < kRefused
  uint32_t count;  // blocks, 1..kMaxBlocksPerRequest
  uint64_t block;  // first block
  uint64_t addr;   // the client's buffer
  uint32_t rkey;
  uint32_t pad2;
};

struct RpingInfo {
  uint64_t buf;   // big-endian
  uint32_t rkey;  // big-endian
  uint32_t size;  // big-endian
};
static_assert(sizeof(RpingInfo) == 16, "rping's rping_rdma_info is 16 bytes");

}  // namespace cqd::examples::blockd

#endif  // CQD_EXAMPLES_BLOCKD_PROTOCOL_H_
