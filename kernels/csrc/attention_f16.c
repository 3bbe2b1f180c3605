// attention.c over a 16-bit KV cache: specray_attention_f16 reads fp16 keys and values and
// widens them to fp32 as it loads them; every other step of its arithmetic is attention.c's.
#define KV_HALF 1
#include "attention.c"
