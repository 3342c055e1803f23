// The fiber scheduler of rsd_emu/lanes.h and the few HIP runtime calls rocm_sd's launchers make, for one
// emulated device (its architecture fixed at compile time: RSD_EMU_ARCH, wave size from compat.h's rule).
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <thread>

#include "rocm_sd/compat.h"  // the emulated device's RSD_WAVE, by compat.h's own rule
#include "rsd_emu/lanes.h"

namespace rsd_emu {
namespace {

// Kernel frames hold register tiles (attention keeps whole rows of fp32 accumulators): generous, and only the
// pages a lane touches are ever backed by memory.
constexpr size_t kStackBytes = 256 * 1024;

thread_local Block* current_block = nullptr;

std::mutex error_mutex;
std::string first_error;  // of the running launch

void lane_main() {
  Block& block = *current_block;
  Lane& lane = block.lanes[block.current];
  try {
    (*block.body)();
    const int wave = lane.linear / wave_size();
    lane.state = LaneState::done;
    --block.live;
    if (block.wave_arrived[wave] > 0)
      fail("lane " + std::to_string(lane.linear % wave_size()) + " of wave " + std::to_string(wave) +
           " returned while the rest of its wave waits at a cross-lane operation");
    if (block.barrier_arrived > 0 && block.barrier_arrived == block.live) {
      for (Lane& other : block.lanes)
        if (other.state == LaneState::waiting && other.waiting_at && std::strcmp(other.waiting_at, "__syncthreads") == 0) {
          other.state = LaneState::ready;
          other.waiting_at = nullptr;
        }
      block.barrier_arrived = 0;
    }
  } catch (const EmulationError& e) {
    block.error = e.what();
  } catch (const std::exception& e) {
    block.error = e.what();
  }
  lane.state = LaneState::done;
  swapcontext(&lane.context, &block.scheduler);  // never resumed
}

std::string describe_deadlock(const Block& block) {
  std::string what = "deadlock in block (" + std::to_string(block.block_idx.x) + "," +
                     std::to_string(block.block_idx.y) + "): lanes wait at";
  for (const Lane& lane : block.lanes)
    if (lane.state == LaneState::waiting) {
      what += std::string(" ") + (lane.waiting_at ? lane.waiting_at : "?") + " (lane " + std::to_string(lane.linear) + ")";
      break;
    }
  return what;
}

// What run_block returns for a block left unfinished because another block of its launch failed (that one's
// message is the launch's).
const char* const kAborted = "aborted: another block of the launch failed";

// Runs every lane of one block to completion; returns the failure message or "".
std::string run_block(Block& block, unsigned char* stacks) {
  current_block = &block;
  for (int i = 0; i < int(block.lanes.size()); ++i) {
    Lane& lane = block.lanes[i];
    getcontext(&lane.context);
    lane.context.uc_stack.ss_sp = stacks + size_t(i) * kStackBytes;
    lane.context.uc_stack.ss_size = kStackBytes;
    lane.context.uc_link = nullptr;
    makecontext(&lane.context, lane_main, 0);
  }
  for (;;) {
    bool ran = false, all_done = true;
    for (int i = 0; i < int(block.lanes.size()); ++i) {
      if (block.lanes[i].state != LaneState::ready) continue;
      block.current = i;
      swapcontext(&block.scheduler, &block.lanes[i].context);
      ran = true;
      if (!block.error.empty()) return block.error;
      if (block.launch_failed->load(std::memory_order_relaxed)) return kAborted;
    }
    for (const Lane& lane : block.lanes) all_done = all_done && lane.state == LaneState::done;
    if (all_done) return "";
    if (!ran) return describe_deadlock(block);
  }
}

}  // namespace

void fail(const std::string& why) { throw EmulationError(why); }

int wave_size() { return RSD_WAVE; }

int Block::lanes_in_wave(int wave) const {
  return std::min<int>(wave_size(), int(lanes.size()) - wave * wave_size());
}

Block& this_block() { return *current_block; }

void yield() {
  Block& block = *current_block;
  swapcontext(&block.lanes[block.current].context, &block.scheduler);
}

void block_barrier() {
  Block& block = this_block();
  Lane& lane = this_lane();
  if (++block.barrier_arrived < block.live) {
    lane.state = LaneState::waiting;
    lane.waiting_at = "__syncthreads";
    yield();
    return;
  }
  for (Lane& other : block.lanes)
    if (other.state == LaneState::waiting && other.waiting_at && std::strcmp(other.waiting_at, "__syncthreads") == 0) {
      other.state = LaneState::ready;
      other.waiting_at = nullptr;
    }
  block.barrier_arrived = 0;
}

void declare_shared(void* storage, size_t bytes) {
  Block& block = this_block();
  if (std::find(block.shared.begin(), block.shared.end(), storage) != block.shared.end()) return;
  block.shared.push_back(storage);
  std::memset(storage, 0xff, bytes);
}

std::string run_grid(Dim3 grid, Dim3 block_dim, const std::function<void()>& body, int resident) {
  const int64_t blocks = int64_t(grid.x) * grid.y * grid.z;
  const int threads = int(block_dim.x * block_dim.y * block_dim.z);
  if (threads < 1 || threads > 1024) return "invalid block size " + std::to_string(threads);
  first_error.clear();
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  auto worker = [&]() {
    const size_t bytes = size_t(threads) * kStackBytes;
    void* stacks = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (stacks == MAP_FAILED) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (first_error.empty()) first_error = "cannot map lane stacks";
      failed = true;
      return;
    }
    for (int64_t b = next++; b < blocks && !failed; b = next++) {
      Block block;
      block.block_idx = Dim3(uint32_t(b % grid.x), uint32_t(b / grid.x % grid.y), uint32_t(b / grid.x / grid.y));
      block.block_dim = block_dim;
      block.grid_dim = grid;
      block.lanes.resize(threads);
      for (int t = 0; t < threads; ++t) {
        block.lanes[t].linear = t;
        block.lanes[t].thread_idx =
            Dim3(uint32_t(t % block_dim.x), uint32_t(t / block_dim.x % block_dim.y), uint32_t(t / block_dim.x / block_dim.y));
      }
      block.wave_arrived.assign((threads + wave_size() - 1) / wave_size(), 0);
      block.live = threads;
      block.launch_failed = &failed;
      block.body = &body;
      const std::string error = run_block(block, static_cast<unsigned char*>(stacks));
      if (!error.empty() && error != kAborted) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (first_error.empty()) first_error = error;
        failed = true;
      }
    }
    munmap(stacks, bytes);
  };
  const int workers = int(std::max<int64_t>(1, std::min<int64_t>(blocks, resident)));
  std::vector<std::thread> pool;
  for (int w = 1; w < workers; ++w) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();
  return first_error;
}

}  // namespace rsd_emu

// ---- the HIP runtime calls of rocm_sd's launchers, for the one emulated device ----
namespace {
hipError_t last_error = hipSuccess;
std::string last_message;
}  // namespace

namespace rsd_emu {
void set_launch_error(const std::string& message) {
  if (message.empty()) return;
  last_error = hipErrorLaunchFailure;
  last_message = message;
}
}  // namespace rsd_emu

hipError_t hipGetLastError() {
  const hipError_t e = last_error;
  last_error = hipSuccess;
  return e;
}
const char* hipGetErrorString(hipError_t e) {
  return e == hipSuccess ? "no error" : (last_message.empty() ? "error" : last_message.c_str());
}
hipError_t hipGetDevice(int* device) { *device = 0; return hipSuccess; }
hipError_t hipSetDevice(int device) { return device == 0 ? hipSuccess : hipErrorInvalidDevice; }
hipError_t hipGetDeviceCount(int* count) { *count = 1; return hipSuccess; }
hipError_t hipDeviceGetAttribute(int* value, hipDeviceAttribute_t attr, int device) {
  if (device != 0) return hipErrorInvalidDevice;
  switch (attr) {
    case hipDeviceAttributeMultiprocessorCount: *value = rsd_emu::kMultiprocessors; break;
    case hipDeviceAttributeWarpSize: *value = RSD_WAVE; break;
    case hipDeviceAttributeL2CacheSize: *value = 4 << 20; break;
  }
  return hipSuccess;
}
hipError_t hipGetDeviceProperties(hipDeviceProp_t* prop, int device) {
  if (device != 0) return hipErrorInvalidDevice;
  *prop = hipDeviceProp_t{};
  std::snprintf(prop->name, sizeof(prop->name), "rsd_emu CPU emulation of %s", RSD_EMU_ARCH);
  std::snprintf(prop->gcnArchName, sizeof(prop->gcnArchName), "%s", RSD_EMU_ARCH);
  prop->multiProcessorCount = rsd_emu::kMultiprocessors;
  prop->warpSize = RSD_WAVE;
  prop->l2CacheSize = 4 << 20;
  return hipSuccess;
}
hipError_t hipRuntimeGetVersion(int* v) { *v = 0; return hipSuccess; }
hipError_t hipDriverGetVersion(int* v) { *v = 0; return hipSuccess; }
hipError_t hipMemsetAsync(void* p, int value, size_t bytes, hipStream_t) {
  std::memset(p, value, bytes);
  return hipSuccess;
}
