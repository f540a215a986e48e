// The per-file baseline: one torch::save file per stashed tensor, as the original Python feature
// does with torch.save / torch.load / os.remove. Reproduced faithfully so benchmarks compare
// spillarena with what it replaces, not with a straw man; only the opens are hardened
// (see Note [Per-file names in a shared directory]).
#include <atomic>
#include <cerrno>
#include <cstring>
#include <utility>

#include "core/platform.h"
#include "spill/tensor_stash.h"
#include "storable.h"

namespace spill {
namespace {

// Note [Per-file names in a shared directory]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// These files have names, in a directory other users may be able to write (/tmp). Each is
// created with O_CREAT | O_EXCL | O_NOFOLLOW and mode 0600: a name that already exists, such as
// a symlink planted to make us write through it, is passed over for the next number and never
// opened. restore() opens with O_NOFOLLOW and checks it is the file written: the same inode
// (which a file system reuses as soon as ours is deleted), changed last at the same nanosecond
// (the kernel sets that time; utimensat cannot) and of the same size. A file swapped in
// meanwhile is refused, not loaded. unlink removes a name, never a symlink's target.
constexpr int kNameAttempts = 64;

class Descriptor {
 public:
  explicit Descriptor(int fd) : fd_(fd) {}
  ~Descriptor() { platform::close_file(fd_); }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

[[noreturn]] void fail(IoOp op, const std::string& what, const std::string& path, int e) {
  throw IoError(e, "spill: per-file stash: " + what + " '" + path + "' failed: " +
                       std::strerror(e) +
                       "; check the directory's free space and that nothing else writes there",
                op);
}

// One counter for the process: two stashes on the same directory never share a file name.
std::uint64_t next_file_number() {
  static std::atomic<std::uint64_t> counter{0};
  return counter.fetch_add(1);
}

// A new file of this process's, never an existing name; *path says which.
int create_file(const std::string& directory, std::string* path) {
  const std::string prefix =
      directory + "/spillarena-per-file-" + std::to_string(platform::process_id()) + "-";
  int e = EEXIST;
  for (int attempt = 0; attempt < kNameAttempts && e == EEXIST; ++attempt) {
    *path = prefix + std::to_string(next_file_number()) + ".pt";
    int fd = -1;
    e = platform::create_new_file(*path, &fd);
    if (e == 0) return fd;
  }
  fail(IoOp::write, "creating", *path, e);
}

// torch::save through the descriptor: the writer moves every chunk with write_at.
void save(const torch::Tensor& host, int fd, const std::string& path) {
  std::uint64_t at = 0;
  int error = 0;
  auto writer = [&](const void* data, std::size_t n) -> std::size_t {
    if (error == 0) error = platform::write_at(fd, data, n, at);
    if (error != 0) return 0;
    at += n;
    return n;
  };
  try {
    torch::save(host, writer);
  } catch (const c10::Error&) {
    if (error == 0) throw;
  }
  if (error != 0) fail(IoOp::write, "writing", path, error);
}

// torch::load through the descriptor: the reader moves what it asks for with read_at.
torch::Tensor load(int fd, std::uint64_t size_bytes, const std::string& path) {
  int error = 0;
  auto reader = [&](std::uint64_t pos, void* buffer, std::size_t n) -> std::size_t {
    if (pos >= size_bytes) return 0;
    n = static_cast<std::size_t>(std::min<std::uint64_t>(n, size_bytes - pos));
    if (error == 0) error = platform::read_at(fd, buffer, n, pos);
    return error == 0 ? n : 0;
  };
  torch::Tensor t;
  try {
    torch::load(t, reader, [size_bytes] { return static_cast<std::size_t>(size_bytes); });
  } catch (const c10::Error&) {
    if (error == 0) throw;
  }
  if (error != 0) fail(IoOp::read, "reading", path, error);
  return t;
}

class PerFileStashed final : public StashedTensor {
 public:
  PerFileStashed(std::string path, platform::FileStatus written, torch::Device device)
      : path_(std::move(path)), written_(written), device_(device) {}
  ~PerFileStashed() override { platform::remove_file(path_); }

  torch::Tensor restore() override {
    int raw = -1;
    if (int e = platform::open_for_reading(path_, &raw); e != 0) {
      fail(IoOp::read, "opening", path_, e);
    }
    Descriptor file(raw);
    platform::FileStatus now;
    if (int e = platform::file_status(file.get(), &now); e != 0) {
      fail(IoOp::read, "fstat of", path_, e);
    }
    if (now.device != written_.device || now.inode != written_.inode ||
        now.change_time_ns != written_.change_time_ns || now.size_bytes != written_.size_bytes) {
      fail(IoOp::read, "reading back (another file now has its name)", path_, ESTALE);
    }
    torch::Tensor t = load(file.get(), now.size_bytes, path_);
    platform::remove_file(path_);
    return device_.is_cpu() ? t : t.to(device_);
  }

 private:
  std::string path_;
  platform::FileStatus written_;  // the file as store() left it
  torch::Device device_;
};

class PerFileStash final : public TensorStash {
 public:
  explicit PerFileStash(std::string directory) : directory_(std::move(directory)) {
    if (int e = platform::check_writable_directory(directory_); e != 0) {
      throw DirectoryError(directory_, e, "spill: per-file stash directory '" + directory_ +
                                              "' is missing or not writable; create it or choose "
                                              "another");
    }
  }

  std::unique_ptr<StashedTensor> store(const torch::Tensor& tensor) override {
    detail::check_storable(tensor, name());
    torch::Tensor host = tensor.device().is_cpu() ? tensor : tensor.to(torch::kCPU);
    std::string path;
    Descriptor file(create_file(directory_, &path));
    platform::FileStatus written;
    try {
      save(host, file.get(), path);
      if (int e = platform::file_status(file.get(), &written); e != 0) {
        fail(IoOp::write, "fstat of", path, e);
      }
    } catch (...) {
      platform::remove_file(path);
      throw;
    }
    return std::make_unique<PerFileStashed>(path, written, tensor.device());
  }

  std::string name() const override { return "per_file"; }

 private:
  std::string directory_;
};

}  // namespace

std::shared_ptr<TensorStash> make_per_file_stash(const std::string& directory) {
  return std::make_shared<PerFileStash>(directory);
}

}  // namespace spill
