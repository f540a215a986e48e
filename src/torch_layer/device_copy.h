// DeviceCopy: a copy between an accelerator and host memory on a side stream, ordered after the
// work already queued on the current stream, with an event that says when it is done. Device-
// generic through c10's stream/event interfaces: nothing here names CUDA. CPU tensors never get
// here. See Note [Accelerator copies] in src/torch_layer/device_copy.cc.
#pragma once

#include <c10/core/Event.h>
#include <torch/torch.h>

#include <optional>

namespace spill::detail {

class DeviceCopy {
 public:
  // Device -> host: a pinned host tensor (pageable where pinning fails, with one warning)
  // receiving `source`; `source` is kept alive until the copy completed.
  static DeviceCopy to_host(const torch::Tensor& source);
  // Host -> `device`: the device tensor, filled once the copy completed; `host` is kept alive.
  static DeviceCopy to_device(const torch::Tensor& host, const torch::Device& device);

  bool done() const;              // never blocks
  void synchronize() const;       // blocks the host until done
  void order_current_stream();    // the current stream waits for the copy; the host does not
  const torch::Tensor& result() const { return result_; }
  // Releases the tensor kept alive for the copy once it is done (call from time to time).
  void release_source_if_done();
  // Drops this handle's reference to the result. Safe once order_current_stream() ran: the
  // current stream's later work, which may reuse the memory, is ordered after the copy.
  void release_result() { result_ = torch::Tensor(); }

 private:
  DeviceCopy(torch::Tensor source, torch::Tensor result, c10::Event event);
  torch::Tensor source_;
  torch::Tensor result_;
  std::optional<c10::Event> event_;
};

}  // namespace spill::detail
