// symheap's asynchronous Work for its torch.distributed backend, as a C++ c10d::Work.
//
// Why C++: symheap enqueues a collective on torch's current stream when it is called, so a Work
// has nothing left to run; it only has to make a later stream wait for that one and, for DDP,
// hand out a future holding the outputs. Built from Python that takes torch's CUDA future per
// call (a CUDA event created, recorded and destroyed each time, and the value pickled to find
// its tensors): ~7 us of host time on an H100 host, more than NCCL's whole asynchronous
// overhead. Here an event from a pool is recorded on the collective's stream (no creation),
// wait() makes the waiting stream wait for it only when it is another stream, and the future is
// made only if someone asks for it (DDP does; functional collectives and FSDP2 only wait).
//
// Built against the torch it runs with (symheap/distributed/cpp_work.py compiles it once per
// torch version into symheap's cache); nothing here is needed for correctness: without it the
// backend returns torch's own future-backed Work.
//
// No CUDA header is used: streams and events go through c10's device-generic interfaces
// (c10::Stream, c10::Event), which dispatch to the CUDA implementation torch registers.

#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/utils/pybind.h>

#include <ATen/core/ivalue.h>
#include <ATen/core/jit_type.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

// Events are kept per device index and reused: creating and destroying one per call is most of
// what the CUDA future costs. A returned event may still have waits pending on other streams:
// cudaStreamWaitEvent takes the event's state when it is called, so recording it again later
// cannot change what an earlier wait waits for.
class EventPool {
 public:
  std::unique_ptr<c10::Event> take(c10::DeviceType type, c10::DeviceIndex index) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(key(type, index));
      if (it != free_.end() && !it->second.empty()) {
        auto ev = std::move(it->second.back());
        it->second.pop_back();
        return ev;
      }
    }
    created_.fetch_add(1, std::memory_order_relaxed);
    return std::make_unique<c10::Event>(type, c10::EventFlag::PYTORCH_DEFAULT);
  }

  void give(c10::DeviceType type, c10::DeviceIndex index, std::unique_ptr<c10::Event> ev) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& list = free_[key(type, index)];
    // A bound on what is kept: more Works alive at once than this is not a steady state.
    if (list.size() < 1024) {
      list.push_back(std::move(ev));
    }
  }

  int64_t created() const {
    return created_.load(std::memory_order_relaxed);
  }

 private:
  static int64_t key(c10::DeviceType type, c10::DeviceIndex index) {
    return (static_cast<int64_t>(type) << 32) | static_cast<int64_t>(static_cast<uint16_t>(index));
  }

  std::mutex mu_;
  std::unordered_map<int64_t, std::vector<std::unique_ptr<c10::Event>>> free_;
  std::atomic<int64_t> created_{0};
};

EventPool& pool() {
  // Never destroyed: Works can outlive module teardown at interpreter exit.
  static EventPool* p = new EventPool();
  return *p;
}

c10::Stream current_stream(c10::Device device) {
  return c10::impl::getDeviceGuardImpl(device.type())->getStream(device);
}

// One stream the collective ran on and an event recorded there right after it.
struct Recorded {
  c10::Stream stream;
  std::unique_ptr<c10::Event> event;
};

class SymheapWork : public c10d::Work {
 public:
  SymheapWork(std::vector<at::Tensor> outputs, std::vector<Recorded> recorded)
      : c10d::Work(-1, c10d::OpType::UNKNOWN),
        outputs_(std::move(outputs)),
        recorded_(std::move(recorded)) {
    // The host enqueued everything: the Work is complete from the start (torch's base methods
    // that look at the completion flag see it too).
    finish();
  }

  ~SymheapWork() override {
    for (auto& r : recorded_) {
      pool().give(r.stream.device_type(), r.stream.device_index(), std::move(r.event));
    }
  }

  bool isCompleted() override {
    return true;
  }

  bool isSuccess() const override {
    return true;
  }

  std::vector<at::Tensor> result() override {
    return outputs_;
  }

  // What ProcessGroupNCCL's Work does: the stream current now (on each device) waits for the
  // collective's stream; no host synchronisation. The same stream needs nothing.
  bool wait(std::chrono::milliseconds /*timeout*/) override {
    block_current_streams();
    return true;
  }

  void synchronize() override {
    block_current_streams();
  }

  // The outputs as a completed future, made on the first call: a CUDA future records its own
  // events on the collective's streams (so its callbacks and waiters order after the
  // collective), which is the cost the Work avoids for callers that never ask.
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    std::lock_guard<std::mutex> lock(future_mu_);
    if (!future_) {
      std::vector<c10::Device> devices;
      std::vector<c10::Stream> streams;
      for (const auto& r : recorded_) {
        devices.push_back(r.stream.device());
        streams.push_back(r.stream);
      }
      auto fut = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors(), devices);
      c10::MultiStreamGuard guard(streams);
      fut->markCompleted(c10::IValue(outputs_));
      future_ = std::move(fut);
    }
    return future_;
  }

 private:
  void block_current_streams() {
    for (const auto& r : recorded_) {
      const c10::Stream now = current_stream(r.stream.device());
      if (now != r.stream) {
        r.event->block(now);
      }
    }
  }

  std::vector<at::Tensor> outputs_;
  std::vector<Recorded> recorded_;
  std::mutex future_mu_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// A completed Work over `outputs`: an event recorded on the current stream of every device
// other than the CPU that holds one of them (the stream the backend just enqueued on).
c10::intrusive_ptr<c10d::Work> done(std::vector<at::Tensor> outputs) {
  std::vector<Recorded> recorded;
  for (const auto& t : outputs) {
    const c10::Device device = t.device();
    if (device.is_cpu() || device.is_meta()) {
      continue;
    }
    bool seen = false;
    for (const auto& r : recorded) {
      seen = seen || r.stream.device() == device;
    }
    if (seen) {
      continue;
    }
    const c10::Stream stream = current_stream(device);
    auto event = pool().take(device.type(), device.index());
    event->record(stream);
    recorded.push_back(Recorded{stream, std::move(event)});
  }
  return c10::make_intrusive<SymheapWork>(std::move(outputs), std::move(recorded));
}

} // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "symheap's asynchronous c10d Work (see symheap/distributed/cpp_work.py)";
  m.def(
      "done",
      &done,
      "A completed Work holding `outputs`, ordered after the work enqueued so far on their "
      "devices' current streams.",
      py::arg("outputs"));
  m.def(
      "events_created",
      []() { return pool().created(); },
      "How many events the pool has created (the rest were reused).");
}
