// The execution model of the CPU emulation: every GPU thread (lane) of a block is a fiber, and a block is run
// by one OS thread that switches between its lanes cooperatively.
//
// A lane runs on its own until it reaches an operation that needs other lanes: a wave-wide operation (shuffle,
// matrix instruction) or a block barrier. There it deposits its operands and yields. When the last lane of its
// wave (or block) arrives, the operation is computed once for the whole wave from all lanes' operands (the
// way the hardware executes it: one instruction, every lane's registers), each lane gets its own result, and
// the lanes go on. Between those points lanes are independent, which is all SIMT lockstep guarantees to
// code that communicates only through cross-lane operations and barriers.
//
// Checks the hardware would not make: a wave-wide operation that not every lane of the wave reaches (a lane
// that returned early, or lanes waiting at different operations) fails the launch, as does a shuffle that
// reads a lane that does not exist; rocm_sd's kernels promise full waves at every cross-lane operation
// (compat.h). Blocks of one launch run on several OS threads at once (the emulated device's co-resident
// blocks), so kernels whose blocks wait for each other (the resident GroupNorm) make progress. When one block
// fails, the launch fails: the blocks still running end at their next yield, so a block waiting for the failed
// one does not spin to its bound.
//
// Shared memory (__shared__) starts each block as 0xff bytes (declare_shared), NaN in every float format: a
// lane that reads a slot no lane of its block wrote reads NaN, where the GPU gives whatever an earlier
// workgroup left.
#pragma once

#include <ucontext.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace rsd_emu {

struct Dim3 {
  uint32_t x = 1, y = 1, z = 1;
  constexpr Dim3(uint32_t x_ = 1, uint32_t y_ = 1, uint32_t z_ = 1) : x(x_), y(y_), z(z_) {}
};

// A launch fails with this; the runtime turns it into hipGetLastError's error and message.
struct EmulationError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
[[noreturn]] void fail(const std::string& why);

// The wave size of the emulated device: 64 for gfx9 (CDNA), 32 for gfx10+ (RDNA), as compat.h's RSD_WAVE.
int wave_size();

enum class LaneState { ready, waiting, done };

constexpr int kSlotBytes = 256;

struct Lane {
  Dim3 thread_idx;
  int linear = 0;
  LaneState state = LaneState::ready;
  const char* waiting_at = nullptr;  // the cross-lane operation the lane waits at
  ucontext_t context;
  alignas(16) unsigned char in[kSlotBytes];   // operands deposited at a wave-wide operation
  alignas(16) unsigned char out[kSlotBytes];  // this lane's result of it
};

struct Block {
  Dim3 block_idx, block_dim, grid_dim;
  std::vector<Lane> lanes;
  std::vector<int> wave_arrived;  // lanes of each wave waiting at a wave-wide operation
  int barrier_arrived = 0;
  int live = 0;  // lanes that have not returned
  std::string error;
  const std::atomic<bool>* launch_failed = nullptr;  // another block of the launch failed: stop at the next yield
  std::vector<const void*> shared;  // the __shared__ variables the block's lanes declared, poisoned once each
  const std::function<void()>* body = nullptr;
  ucontext_t scheduler;
  int current = 0;

  int waves() const { return int(wave_arrived.size()); }
  int lanes_in_wave(int wave) const;
};

Block& this_block();
inline Lane& this_lane() { return this_block().lanes[this_block().current]; }

// Gives the CPU to the block's other lanes; the lane comes back when it is ready again.
void yield();

// A wave-wide operation: every lane of the wave calls it with its own `in`; `combine(ins, outs, lanes)` runs
// once over all of them (ins / outs indexed by lane in the wave); each lane returns its own out.
template <class In, class Out, class Combine>
Out wave_collective(const char* name, const In& in, Combine combine) {
  static_assert(sizeof(In) <= kSlotBytes && sizeof(Out) <= kSlotBytes, "operands larger than a lane slot");
  Block& block = this_block();
  Lane& lane = this_lane();
  const int wave = lane.linear / wave_size(), first = wave * wave_size(), count = block.lanes_in_wave(wave);
  std::memcpy(lane.in, &in, sizeof(In));
  lane.waiting_at = name;
  if (++block.wave_arrived[wave] < count) {
    lane.state = LaneState::waiting;
    yield();
  } else {
    std::vector<In> ins(count);
    std::vector<Out> outs(count);
    for (int l = 0; l < count; ++l) {
      Lane& other = block.lanes[first + l];
      if (other.state == LaneState::done || std::strcmp(other.waiting_at ? other.waiting_at : "", name) != 0)
        fail(std::string("lanes of wave ") + std::to_string(wave) + " do not all reach " + name + " (lane " +
             std::to_string(l) + (other.state == LaneState::done ? " returned" : " waits elsewhere") + ")");
      std::memcpy(&ins[l], other.in, sizeof(In));
    }
    combine(ins.data(), outs.data(), count);
    for (int l = 0; l < count; ++l) {
      Lane& other = block.lanes[first + l];
      std::memcpy(other.out, &outs[l], sizeof(Out));
      other.waiting_at = nullptr;
      if (other.state == LaneState::waiting) other.state = LaneState::ready;
    }
    block.wave_arrived[wave] = 0;
  }
  Out out;
  std::memcpy(&out, lane.out, sizeof(Out));
  return out;
}

// __syncthreads: waits until every lane of the block that has not returned arrives.
void block_barrier();

// A lane passed the declaration of the __shared__ variable at `storage` (tests/amd_emulation/build.py puts the
// call after each): the first lane of the running block to pass it fills it with 0xff bytes.
void declare_shared(void* storage, size_t bytes);

// Runs `body` once per lane for every block of the grid, on up to `resident` OS threads. Returns the first
// failure's message, or "" on success.
std::string run_grid(Dim3 grid, Dim3 block, const std::function<void()>& body, int resident);

}  // namespace rsd_emu
