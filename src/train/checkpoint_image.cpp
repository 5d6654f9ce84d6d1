// A checkpoint's bytes: the user-block header (render, verify), the in-memory HDF5 writer and the
// zero-copy in-memory reader (see checkpoint_image.hpp and docs/checkpoint-format.md).
#include "train/checkpoint_image.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string_view>
#include <utility>

#include "ddpv/core/crc32c.hpp"
#include "ddpv/train/checkpoint.hpp"

namespace ddpv::ckpt {
namespace {

static_assert(std::endian::native == std::endian::little,
              "checkpoint checksums are defined over little-endian values");

constexpr std::string_view kMagic = "ddpvision-checkpoint ";
constexpr std::string_view kCrcKey = "\nheader-crc32c ";
constexpr std::string_view kTableTitle = "# crc32c offset bytes name";
constexpr unsigned char kHdf5Signature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
constexpr size_t kMinUserblock = 512;          // HDF5's smallest
constexpr size_t kMaxHeaderSearch = 64 << 20;  // far above any model's table
constexpr const char* kCrcAttr = "crc32c";

[[noreturn]] void damaged(const std::string& name, const std::string& what) {
  throw CheckpointDamaged("checkpoint " + name + " " + what, __FILE__, __LINE__);
}

std::string hex8(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08" PRIx32, v);
  return buf;
}

// ---- header parsing: every helper takes the line and fails on anything not written by us ----

bool parse_u64(std::string_view s, uint64_t* out) {
  if (s.empty() || s.size() > 20) return false;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), *out, 10);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

bool parse_hex32(std::string_view s, uint32_t* out) {
  if (s.size() != 8) return false;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), *out, 16);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

// "key value" -> value, or an empty view when the line is not that key.
std::string_view value_of(std::string_view line, std::string_view key) {
  if (line.size() <= key.size() + 1 || line.substr(0, key.size()) != key || line[key.size()] != ' ')
    return {};
  return line.substr(key.size() + 1);
}

// Splits the trusted header text (which ends in '\n') into lines.
std::vector<std::string_view> lines_of(std::string_view text) {
  std::vector<std::string_view> out;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) break;
    out.push_back(text.substr(pos, nl - pos));
    pos = nl + 1;
  }
  return out;
}

// "e3069283 8192 1728 /params/conv1.weight"
bool parse_tensor_line(std::string_view line, TensorRecord* t) {
  const size_t a = line.find(' ');
  if (a == std::string_view::npos) return false;
  const size_t b = line.find(' ', a + 1);
  if (b == std::string_view::npos) return false;
  const size_t c = line.find(' ', b + 1);
  if (c == std::string_view::npos || c + 1 >= line.size()) return false;
  t->name = std::string(line.substr(c + 1));
  return parse_hex32(line.substr(0, a), &t->crc) &&
         parse_u64(line.substr(a + 1, b - a - 1), &t->offset) &&
         parse_u64(line.substr(b + 1, c - b - 1), &t->bytes) &&
         t->name.find_first_of(" \t\r") == std::string::npos;
}

// The value of "file-bytes N" read before the header is known to be intact, so that a file cut
// short says by how much rather than that its header is damaged; 0 when not readable.
uint64_t claimed_file_bytes(const uint8_t* data, size_t size) {
  const std::string_view head(reinterpret_cast<const char*>(data), std::min<size_t>(size, 256));
  const size_t at = head.find("\nfile-bytes ");
  if (at == std::string_view::npos) return 0;
  const size_t begin = at + 12, end = head.find('\n', begin);
  uint64_t n = 0;
  if (end == std::string_view::npos || !parse_u64(head.substr(begin, end - begin), &n)) return 0;
  return n;
}

// Names the tensors whose bytes fail their CRC, for a payload that fails its own.
std::string damaged_tensors(const uint8_t* data, const std::vector<TensorRecord>& tensors) {
  std::vector<std::string> bad;
  for (const TensorRecord& t : tensors)
    if (crc32c(data + t.offset, t.bytes) != t.crc) bad.push_back(t.name);
  if (bad.empty())
    return "is damaged: its HDF5 metadata (the bytes outside every tensor) fails the payload "
           "checksum (or it was edited in place, e.g. by h5py: see docs/checkpoint-format.md)";
  std::string msg = "is damaged: tensor " + bad[0] + " fails its checksum";
  if (bad.size() > 1) msg += " (and " + std::to_string(bad.size() - 1) + " more tensors)";
  return msg;
}

// ---- file-image callbacks: libhdf5 "copies" the image onto itself (see ImageFile) -----------

using View = ImageFile::View;
void* image_malloc(size_t size, H5FD_file_image_op_t op, void* udata) {
  const View* v = static_cast<View*>(udata);
  const bool ours = op == H5FD_FILE_IMAGE_OP_PROPERTY_LIST_SET ||
                    op == H5FD_FILE_IMAGE_OP_PROPERTY_LIST_COPY ||
                    op == H5FD_FILE_IMAGE_OP_FILE_OPEN;
  return ours && size == v->size ? v->data : nullptr;
}
void* image_memcpy(void* dest, const void* src, size_t size, H5FD_file_image_op_t, void* udata) {
  const View* v = static_cast<View*>(udata);
  return dest == v->data && src == v->data && size == v->size ? dest : nullptr;
}
void* image_realloc(void*, size_t, H5FD_file_image_op_t, void*) { return nullptr; }  // read-only
herr_t image_free(void*, H5FD_file_image_op_t, void*) { return 0; }  // the owner frees it
void* udata_copy(void* udata) { return udata; }
herr_t udata_free(void*) { return 0; }

// The writer's callbacks: the core driver grows its image with realloc, here ours, on pages
// faulted in by one call (the driver zero-fills each new stretch, so it touches them all).
using Memory = ImageWriter::Memory;
void* grow_realloc(void* ptr, size_t size, H5FD_file_image_op_t, void* udata) {
  Memory* m = static_cast<Memory*>(udata);
  if (ptr != m->ptr || size == 0) return nullptr;
  void* p = m->ptr == nullptr ? ::mmap(nullptr, size, PROT_READ | PROT_WRITE,
                                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0)
                              : ::mremap(m->ptr, m->size, size, MREMAP_MAYMOVE);
  if (p == MAP_FAILED) return nullptr;
  m->ptr = static_cast<uint8_t*>(p);
  m->size = size;
  return p;
}
void* grow_malloc(size_t size, H5FD_file_image_op_t op, void* udata) {
  return static_cast<Memory*>(udata)->ptr == nullptr ? grow_realloc(nullptr, size, op, udata)
                                                     : nullptr;
}
void* grow_memcpy(void* dest, const void* src, size_t size, H5FD_file_image_op_t, void*) {
  return std::memcpy(dest, src, size);
}
herr_t keep_free(void* ptr, H5FD_file_image_op_t, void* udata) {  // Memory unmaps it
  return ptr == static_cast<Memory*>(udata)->ptr ? 0 : -1;
}

// Note [Unique image names]: libhdf5 shares one open file among opens that name the same file,
// and for in-memory files the name is the identity; each in-memory file gets a name of its own.
std::string unique_name(const std::string& name) {
  static std::atomic<uint64_t> counter{0};
  return name + "#mem" + std::to_string(counter.fetch_add(1));
}

}  // namespace

Bytes::Bytes(size_t size) : size_(size) {
  if (size == 0) return;
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  data_ = static_cast<uint8_t*>(p);
}
Bytes::~Bytes() {
  if (data_ != nullptr) ::munmap(data_, size_);
}
Bytes::Bytes(Bytes&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
Bytes& Bytes::operator=(Bytes&& o) noexcept {
  if (this != &o) {
    if (data_ != nullptr) ::munmap(data_, size_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

Bytes read_file(const std::string& path, bool from_disk) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT)
      DDPV_FAIL("checkpoint ", path, " does not exist (check --resume / --checkpoint-dir)");
    damaged(path, std::string("cannot be read: ") + std::strerror(errno));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) damaged(path, std::string("cannot be read: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) damaged(path, "is not a regular file");
  // Clean pages only (the writer fsync'ed them); a kernel or file system that keeps them
  // anyway makes this a read from the cache, which is still a check of what it returns.
  if (from_disk) (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  // read(2), not mmap of the file: a file truncated by another process while mapped would end
  // this one with SIGBUS; read gives a short count, which is damage like any other.
  Bytes b(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < b.size()) {
    const ssize_t n = ::read(fd, b.data() + done, b.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) damaged(path, std::string("cannot be read: ") + std::strerror(errno));
    if (n == 0) damaged(path, "shrank while it was read (is another job writing it?)");
    done += static_cast<size_t>(n);
  }
  return b;
}

std::string render_header(uint64_t userblock, uint64_t file_bytes, uint32_t payload_crc,
                          const std::vector<TensorRecord>& tensors) {
  std::string h = std::string(kMagic) + std::to_string(kCheckpointFormatVersion) + "\n";
  h += "userblock " + std::to_string(userblock) + "\n";
  h += "file-bytes " + std::to_string(file_bytes) + "\n";
  h += "payload-crc32c " + hex8(payload_crc) + "\n";
  h += "tensors " + std::to_string(tensors.size()) + "\n";
  h += std::string(kTableTitle) + "\n";
  for (const TensorRecord& t : tensors)
    h += hex8(t.crc) + " " + std::to_string(t.offset) + " " + std::to_string(t.bytes) + " " +
         t.name + "\n";
  h += std::string(kCrcKey.substr(1)) + hex8(crc32c(h.data(), h.size())) + "\n";
  DDPV_CHECK(h.size() <= userblock, "checkpoint header of ", h.size(),
             " bytes exceeds its user block of ", userblock, " (internal)");
  h.resize(userblock, '\0');
  return h;
}

Verified verify_bytes(const uint8_t* data, size_t size, const std::string& name) {
  Verified v;
  if (size >= sizeof kHdf5Signature && std::memcmp(data, kHdf5Signature, 8) == 0) return v;
  if (size == 0) damaged(name, "is empty (0 bytes)");
  if (std::memcmp(data, kMagic.data(), std::min(size, kMagic.size())) != 0)
    damaged(name, "is damaged: it starts with neither a ddpvision header nor the HDF5 signature");
  const uint64_t claimed = claimed_file_bytes(data, size);
  if (claimed > size)
    damaged(name,
            "is truncated: " + std::to_string(size) + " of " + std::to_string(claimed) + " bytes");
  const std::string_view all(reinterpret_cast<const char*>(data), std::min(size, kMaxHeaderSearch));
  const size_t at = all.find(kCrcKey);
  uint32_t header_crc = 0;
  if (at == std::string_view::npos || at + kCrcKey.size() + 9 > all.size() ||
      !parse_hex32(all.substr(at + kCrcKey.size(), 8), &header_crc) ||
      all[at + kCrcKey.size() + 8] != '\n')
    damaged(name, "is damaged: its header has no readable header-crc32c line");
  const size_t text_end = at + 1, header_end = at + kCrcKey.size() + 9;
  if (crc32c(data, text_end) != header_crc)
    damaged(name, "is damaged: its header fails its checksum");

  // The text is as written; anything it does not say exactly is a writer's bug or a forgery.
  const std::vector<std::string_view> lines = lines_of(all.substr(0, text_end));
  auto malformed = [&](const char* what) {
    damaged(name, std::string("has a malformed header (") + what + ")");
  };
  uint64_t version = 0, file_bytes = 0, count = 0;
  uint32_t payload_crc = 0;
  if (lines.size() < 6 || !parse_u64(lines[0].substr(kMagic.size()), &version))
    malformed("format line");
  if (static_cast<int64_t>(version) > kCheckpointFormatVersion)
    DDPV_FAIL("checkpoint ", name, " has format_version ", version, "; this build reads up to ",
              kCheckpointFormatVersion, " (use a newer ddpvision)");
  if (version < 2) malformed("format version");
  if (!parse_u64(value_of(lines[1], "userblock"), &v.userblock) ||
      !std::has_single_bit(v.userblock) || v.userblock < kMinUserblock || v.userblock < header_end)
    malformed("userblock");
  if (!parse_u64(value_of(lines[2], "file-bytes"), &file_bytes) || file_bytes < v.userblock)
    malformed("file-bytes");
  if (!parse_hex32(value_of(lines[3], "payload-crc32c"), &payload_crc)) malformed("payload-crc32c");
  if (!parse_u64(value_of(lines[4], "tensors"), &count) || count != lines.size() - 6 ||
      lines[5] != kTableTitle)
    malformed("tensor table");
  for (size_t i = 6; i < lines.size(); ++i) {
    TensorRecord t;
    if (!parse_tensor_line(lines[i], &t) || t.offset < v.userblock || t.offset > file_bytes ||
        t.bytes > file_bytes - t.offset)
      malformed("tensor line");
    v.tensors.push_back(std::move(t));
  }
  if (size != file_bytes)  // shorter was said above, from the same (then unverified) number
    damaged(name, "is damaged: it has " + std::to_string(size) + " bytes, its header says " +
                      std::to_string(file_bytes) +
                      " (bytes appended, or rewritten by a tool that "
                      "kept the header, as h5repack does: see docs/checkpoint-format.md)");
  for (size_t i = header_end; i < v.userblock; ++i)
    if (data[i] != 0) damaged(name, "is damaged: its user block has bytes after the header");
  if (crc32c(data + v.userblock, size - v.userblock) != payload_crc)
    damaged(name, damaged_tensors(data, v.tensors));
  v.has_header = true;
  v.version = static_cast<int64_t>(version);
  return v;
}

// ---- writing --------------------------------------------------------------------------------

// Note [Write in memory]: libhdf5 never touches the disk when writing a checkpoint. Writing
// through its sec2 driver (the old writer) a full disk failed mid-file with an error whose
// text spans two lines, and libhdf5 then crashed at exit (H5F__close_cb in H5_term_library,
// signal 11) on that file; a write(2) of finished bytes fails with ENOSPC and nothing else.
// The price, measured on a ResNet-50 checkpoint (205 MB, 2-core VM, best of 7): the image is
// a second copy beside the model (zero-filled by the driver, then written into), and its
// writeback starts only at our write(2), where the sec2 writer's ran while it built: see
// docs/checkpoint-format.md for the figures. The tensors come straight from the arenas (no
// host copy of the model on CPU), so the memory peak stays one model's size.
ImageWriter::ImageWriter(const std::vector<std::string>& tensor_names, size_t payload_hint) {
  h5::quiet_errors();
  // Upper bound of the header: fixed lines plus one line per tensor with 20-digit numbers.
  size_t bound = 256;
  for (const std::string& n : tensor_names) {
    DDPV_CHECK(n.find_first_of(" \t\r\n") == std::string::npos, "tensor name '", n,
               "' holds white space (internal)");
    bound += 8 + 1 + 20 + 1 + 20 + 1 + n.size() + 1;
  }
  userblock_ = std::bit_ceil(std::max(bound, kMinUserblock));
  h5::Handle fcpl(DDPV_HDF5_CHECK(H5Pcreate(H5P_FILE_CREATE), "file creation plist"), H5Pclose);
  DDPV_HDF5_CHECK(H5Pset_userblock(fcpl.get(), userblock_), "cannot set a user block of ",
                  userblock_, " bytes");
  h5::Handle fapl(DDPV_HDF5_CHECK(H5Pcreate(H5P_FILE_ACCESS), "file access plist"), H5Pclose);
  // One allocation for the whole image: the increment is the expected size.
  DDPV_HDF5_CHECK(H5Pset_fapl_core(fapl.get(), userblock_ + payload_hint + (1 << 20),
                                   /*backing_store=*/false),
                  "in-memory file driver");
  H5FD_file_image_callbacks_t callbacks = {grow_malloc, grow_memcpy, grow_realloc, keep_free,
                                           udata_copy,  udata_free,  &memory_};
  DDPV_HDF5_CHECK(H5Pset_file_image_callbacks(fapl.get(), &callbacks), "file image callbacks");
  file_ = h5::Handle(DDPV_HDF5_CHECK(H5Fcreate(unique_name("checkpoint").c_str(), H5F_ACC_TRUNC,
                                               fcpl.get(), fapl.get()),
                                     "cannot create an in-memory HDF5 file"),
                     H5Fclose);
}

ImageWriter::Memory::~Memory() {
  if (ptr != nullptr) ::munmap(ptr, size);
}

void ImageWriter::add_tensor(hid_t group, const std::string& group_name, const std::string& name,
                             const std::vector<int64_t>& dims, hid_t file_type, hid_t mem_type,
                             const void* data, size_t bytes) {
  const std::vector<hsize_t> d(dims.begin(), dims.end());
  h5::Handle space(
      DDPV_HDF5_CHECK(d.empty() ? H5Screate(H5S_SCALAR)
                                : H5Screate_simple(static_cast<int>(d.size()), d.data(), nullptr),
                      "cannot create the dataspace of ", name),
      H5Sclose);
  // The default creation properties give a contiguous, unfiltered dataset: its bytes are one
  // range of the file, which the header's table names.
  h5::Handle ds(DDPV_HDF5_CHECK(H5Dcreate2(group, name.c_str(), file_type, space.get(), H5P_DEFAULT,
                                           H5P_DEFAULT, H5P_DEFAULT),
                                "cannot create dataset ", name),
                H5Dclose);
  DDPV_HDF5_CHECK(H5Dwrite(ds.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data),
                  "cannot write dataset ", name);
  const uint32_t crc = crc32c(data, bytes);
  h5::Handle scalar(DDPV_HDF5_CHECK(H5Screate(H5S_SCALAR), "scalar dataspace"), H5Sclose);
  h5::Handle attr(DDPV_HDF5_CHECK(H5Acreate2(ds.get(), kCrcAttr, H5T_STD_U32LE, scalar.get(),
                                             H5P_DEFAULT, H5P_DEFAULT),
                                  "cannot create the crc32c attribute of ", name),
                  H5Aclose);
  DDPV_HDF5_CHECK(H5Awrite(attr.get(), H5T_NATIVE_UINT32, &crc), "cannot write crc32c of ", name);
  const haddr_t offset = H5Dget_offset(ds.get());
  DDPV_CHECK(offset != HADDR_UNDEF, "dataset ", name, " has no contiguous storage (internal)");
  tensors_.push_back(TensorRecord{"/" + group_name + "/" + name, offset, bytes, crc});
}

ImageWriter::View ImageWriter::finish() {
  DDPV_HDF5_CHECK(H5Fflush(file_.get(), H5F_SCOPE_GLOBAL), "cannot flush the in-memory file");
  // The image's size less the user block (the driver's buffer is longer, by its increment).
  const ssize_t n =
      DDPV_HDF5_CHECK(H5Fget_file_image(file_.get(), nullptr, 0), "cannot size the in-memory file");
  const size_t size = userblock_ + static_cast<size_t>(n);
  DDPV_CHECK(memory_.ptr != nullptr && size <= memory_.size, "the in-memory file holds ",
             memory_.size, " bytes, less than its ", size, " (internal)");
  uint8_t* data = memory_.ptr;
  // The table must describe the image: a library that placed a dataset elsewhere than
  // H5Dget_offset says would make every damage report wrong, so check it once here.
  for (const TensorRecord& t : tensors_) {
    DDPV_CHECK(t.offset >= userblock_ && t.offset <= size && t.bytes <= size - t.offset &&
                   crc32c(data + t.offset, t.bytes) == t.crc,
               "tensor ", t.name, " is not where libhdf5 said it wrote it (internal)");
  }
  const uint32_t payload_crc = crc32c(data + userblock_, static_cast<size_t>(n));
  const std::string header = render_header(userblock_, size, payload_crc, tensors_);
  std::memcpy(data, header.data(), userblock_);  // libhdf5 never writes the user block
  return View{data, size};
}

// ---- reading --------------------------------------------------------------------------------

ImageFile::ImageFile(const uint8_t* data, size_t size, const std::string& name)
    : view_{const_cast<uint8_t*>(data), size} {  // opened read-only: libhdf5 never writes it
  h5::quiet_errors();
  h5::Handle fapl(DDPV_HDF5_CHECK(H5Pcreate(H5P_FILE_ACCESS), "file access plist"), H5Pclose);
  DDPV_HDF5_CHECK(H5Pset_fapl_core(fapl.get(), 1 << 16, /*backing_store=*/false),
                  "in-memory file driver");
  // Note [Zero-copy image]: without callbacks libhdf5 copies the image (twice the memory of a
  // 200 MB checkpoint); these hand it our buffer and never free it.
  H5FD_file_image_callbacks_t callbacks = {image_malloc, image_memcpy, image_realloc, image_free,
                                           udata_copy,   udata_free,   &view_};
  DDPV_HDF5_CHECK(H5Pset_file_image_callbacks(fapl.get(), &callbacks), "file image callbacks");
  DDPV_HDF5_CHECK(H5Pset_file_image(fapl.get(), view_.data, view_.size), "file image");
  file_ = h5::Handle(DDPV_HDF5_CHECK(H5Fopen(unique_name(name).c_str(), H5F_ACC_RDONLY, fapl.get()),
                                     name, ": cannot open as HDF5"),
                     H5Fclose);
}

bool read_crc_attr(hid_t dataset, uint32_t* crc) {
  const htri_t has = H5Aexists(dataset, kCrcAttr);
  if (has <= 0) {
    H5Eclear2(H5E_DEFAULT);
    return false;
  }
  const std::vector<uint64_t> v = h5::read_attr_u64s(dataset, kCrcAttr);
  DDPV_CHECK(v.size() == 1 && v[0] <= 0xFFFFFFFFu, "attribute crc32c is not one 32-bit value");
  *crc = static_cast<uint32_t>(v[0]);
  return true;
}

}  // namespace ddpv::ckpt
