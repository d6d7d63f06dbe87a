// What settings.cc needs of the host memory cache (host_tensor.cc), and nothing else.
#pragma once

namespace ferry::internal {

// Reads FERRY_HOST_MEMORY_CACHE_BYTES again and applies it to the cache now (releasing the
// oldest blocks beyond a smaller limit), so that SetSetting takes effect at once and the gauges
// show it. Call without holding any settings lock.
void ApplyHostMemoryCacheSetting();

}  // namespace ferry::internal
