// Turns OpenCL error codes into ferry `Status`es (in the manner of IREE's HAL status helpers).
//
// Every OpenCL failure becomes a Status whose message names the call, the error by its name
// ("CL_OUT_OF_RESOURCES (-5)"), what ferry was doing (the tensor and the device) and the source
// file and line that made the call.
#pragma once

#include <string_view>

#include "ferry/core/status.h"
#include "src/device/opencl/opencl_library.h"

namespace ferry::opencl {

// "CL_INVALID_VALUE" for CL_INVALID_VALUE; "unknown OpenCL error" for codes not in the table.
std::string_view OpenClErrorName(cl_int code);

// The status code for an OpenCL error: ResourceExhausted for allocation failures (device or
// host memory, CL_INVALID_BUFFER_SIZE), Unavailable for a missing platform, device or compiler,
// Internal for the rest (ferry validates its arguments first, so an invalid-argument error from
// OpenCL is ferry's fault or the runtime's, not the caller's). OK for CL_SUCCESS.
absl::StatusCode OpenClErrorStatusCode(cl_int code);

// "<call> failed with <NAME> (<code>) for <what> [file:line]"; OK for CL_SUCCESS.
Status OpenClStatus(cl_int code, std::string_view call, std::string_view what, const char* file,
                    int line);

}  // namespace ferry::opencl

// The Status of an OpenCL call's result `code`, naming `call` (a string) and `what`.
#define FERRY_OPENCL_STATUS(code, call, what) \
  ::ferry::opencl::OpenClStatus((code), (call), (what), __FILE__, __LINE__)

// Returns from the enclosing function with the Status of a failed OpenCL call.
#define FERRY_OPENCL_RETURN_IF_ERROR(code, call, what)        \
  do {                                                        \
    const cl_int ferry_cl_code_ = (code);                     \
    if (ferry_cl_code_ != CL_SUCCESS) {                       \
      return FERRY_OPENCL_STATUS(ferry_cl_code_, call, what); \
    }                                                         \
  } while (false)
