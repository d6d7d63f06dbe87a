// OpenClLibrary: the OpenCL entry points ferry uses, loaded at run time.
//
// ferry never links against libOpenCL: it opens the ICD loader with dlopen and looks up each
// function into a table of pointers, so that one build imports and runs on machines without
// OpenCL (the backend then reports Unavailable, with the reason). <CL/cl.h> is included only for
// its types and constants.
#pragma once

// The API level whose declarations (and therefore function types) cl.h shows. The 1.2 command
// queue constructor is looked up too, for platforms older than 2.0, so its declaration is kept.
#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 300
#endif
#ifndef CL_USE_DEPRECATED_OPENCL_1_2_APIS
#define CL_USE_DEPRECATED_OPENCL_1_2_APIS
#endif
#include <CL/cl.h>

#include <string>
#include <string_view>

#include "ferry/core/status.h"

namespace ferry::opencl {

// Every function the backend calls. Each must be exported by the loader.
#define FERRY_OPENCL_REQUIRED_FUNCTIONS(X) \
  X(clGetPlatformIDs)                      \
  X(clGetPlatformInfo)                     \
  X(clGetDeviceIDs)                        \
  X(clGetDeviceInfo)                       \
  X(clCreateContext)                       \
  X(clReleaseContext)                      \
  X(clReleaseCommandQueue)                 \
  X(clCreateBuffer)                        \
  X(clReleaseMemObject)                    \
  X(clEnqueueWriteBuffer)                  \
  X(clEnqueueWriteBufferRect)              \
  X(clEnqueueReadBuffer)                   \
  X(clEnqueueReadBufferRect)               \
  X(clEnqueueMapBuffer)                    \
  X(clEnqueueUnmapMemObject)               \
  X(clCreateUserEvent)                     \
  X(clSetUserEventStatus)                  \
  X(clSetEventCallback)                    \
  X(clWaitForEvents)                       \
  X(clGetEventInfo)                        \
  X(clReleaseEvent)                        \
  X(clFlush)                               \
  X(clFinish)

// Functions that may be missing (null in the table): the queue constructors of OpenCL 1.x and
// 2.0+; a platform needs one of them.
#define FERRY_OPENCL_OPTIONAL_FUNCTIONS(X) \
  X(clCreateCommandQueue)                  \
  X(clCreateCommandQueueWithProperties)

struct OpenClLibrary {
  // The dlopen handle. Never closed: OpenCL runtimes keep threads that run library code until
  // the process exits.
  void* handle = nullptr;
  // The name the library was opened by ("libOpenCL.so.1").
  std::string name;

#define FERRY_OPENCL_DECLARE_POINTER(function) decltype(&::function) function = nullptr;
  FERRY_OPENCL_REQUIRED_FUNCTIONS(FERRY_OPENCL_DECLARE_POINTER)
  FERRY_OPENCL_OPTIONAL_FUNCTIONS(FERRY_OPENCL_DECLARE_POINTER)
#undef FERRY_OPENCL_DECLARE_POINTER
};

// The library ferry opens by default: the ICD loader's soname.
inline constexpr std::string_view kDefaultOpenClLibrary = "libOpenCL.so.1";

// Opens `library_name` (dlopen) and looks up every function. The result is cached per name for
// the life of the process, so later calls are cheap and return the same table (errors included).
// Unavailable, naming the library and what failed (dlerror's text, or the missing function),
// when the library cannot be opened or lacks a required function. Thread-safe.
StatusOr<const OpenClLibrary*> LoadOpenClLibrary(std::string_view library_name);

// The library named by the setting FERRY_OPENCL_LIBRARY (ferry/core/settings.h), else
// kDefaultOpenClLibrary.
StatusOr<const OpenClLibrary*> LoadDefaultOpenClLibrary();

}  // namespace ferry::opencl
