// CRC32C (Castagnoli), the checksum of checkpoints: SSE4.2's crc32 instruction where the CPU has
// it, a table otherwise; both give the same values.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ddpv {

// The CRC32C of `size` bytes, continuing from `crc` (the value of the bytes before them; 0 to
// start): crc32c(b, n) == crc32c(b + k, n - k, crc32c(b, k)). crc32c("123456789", 9) is
// 0xE3069283, as iSCSI, ext4 and Python's crc32c package compute it.
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);

// The table implementation alone (tests compare the two).
uint32_t crc32c_portable(const void* data, size_t size, uint32_t crc = 0);
// Whether crc32c() runs on the CPU's crc32 instruction.
bool crc32c_hardware();

}  // namespace ddpv
