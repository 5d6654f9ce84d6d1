// Private helpers for crash-safe file replacement: fsync of files and directories, and the
// write-temporary-then-rename step shared by checkpoints and the `latest` pointer.
#pragma once

#include <cstddef>
#include <string>

namespace ddpv::durable {

// Note [Atomic replace]: a file is written under `path + ".tmp"`, flushed and fsync'ed, renamed
// over `path` (rename(2) is atomic within one file system), and then the directory is fsync'ed
// so the rename itself survives a power loss. A reader therefore sees either the previous
// complete file or the new complete file; a crash at any point leaves at most a stray `.tmp`,
// which the next write truncates and a run's start removes (remove_stale_temporaries).

// fsync(2) of a file or directory by path; throws ddpv::Error naming the path.
void fsync_path(const std::string& path);
// The directory holding `path` ("." when it has none).
std::string parent_dir(const std::string& path);
// fsync(tmp), rename(tmp, path), fsync(parent of path). Throws naming both paths.
void commit(const std::string& tmp, const std::string& path);
// Writes `size` bytes to `path` atomically (through path + ".tmp", with write(2)); a full disk
// is one clean error naming the file and the bytes written, and leaves no `.tmp` behind.
void write_file(const std::string& path, const void* data, size_t size);
// Writes `text` to `path` atomically (through path + ".tmp").
void write_text(const std::string& path, const std::string& text);
// Removes `path` if present; never throws (used on error paths).
void remove_quietly(const std::string& path) noexcept;

}  // namespace ddpv::durable
