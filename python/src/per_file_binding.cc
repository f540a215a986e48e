// The per-file baseline's files for Python (src/core/stash/per_file.h): spillarena.stash
// serializes with torch.save and hands the bytes here, so both front ends share the disk half.
#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <utility>

#include "binding.h"
#include "core/stash/per_file.h"

namespace spillarena_python {
namespace {

using spill::detail::PerFile;
using spill::detail::PerFileFiles;

// store(data: bytes): a file holding them.
std::shared_ptr<PerFile> store(const PerFileFiles& files, const py::bytes& data) {
  const std::string_view bytes = data;
  py::gil_scoped_release release;
  return std::make_shared<PerFile>(
      files.store([&](const spill::detail::Sink& sink) { sink(bytes.data(), bytes.size()); }));
}

// restore(): the file's bytes; the file is removed.
py::bytes restore(PerFile& file) {
  std::string bytes;
  {
    py::gil_scoped_release release;
    file.restore([&](const spill::detail::Reader& read, std::uint64_t size_bytes) {
      bytes.resize(static_cast<std::size_t>(size_bytes));
      std::size_t at = 0;
      while (at < bytes.size()) {
        const std::size_t n = read(at, bytes.data() + at, bytes.size() - at);
        if (n == 0) break;
        at += n;
      }
    });
  }
  return py::bytes(bytes);
}

}  // namespace

void bind_per_file(py::module_& m) {
  py::class_<PerFile, std::shared_ptr<PerFile>>(m, "_PerFile", "One per-file stash file.")
      .def("restore", &restore, "The file's bytes; the file is removed.");
  py::class_<PerFileFiles>(m, "_PerFileFiles", "The per-file baseline's directory.")
      .def(py::init([](py::handle directory) {
             return PerFileFiles(
                 Convert<std::string>::from_python(directory, "make_per_file_stash: directory"));
           }),
           py::arg("directory"))
      .def("store", &store, py::arg("data"), "A new file holding `data`.");
}

}  // namespace spillarena_python
