// One row of a generated registry table (ck_registry.h): an instance's name, the GPU targets its source was
// compiled for (';'-separated: XDL instances for CDNA, WMMA ones for RDNA3/4; a GPU of another target has no
// code for it), and the function that runs it on its family's argument struct, returning nullptr on success,
// else why it cannot take the arguments.
#pragma once

namespace rsd::ck {

template <typename Args>
struct InstanceEntry {
  const char* name;
  const char* targets;
  const char* (*run)(const Args&);
};

}  // namespace rsd::ck
