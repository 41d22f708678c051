/*
 * fp4.h: NVFP4's two number formats decoded on the device, from their
 * bits (nvfp4.h has the format): e2m1 codes and e4m3 block scales. CUDA
 * device code, included by the .cu files that decode (train.cu's decode
 * kernel, ggemm.cu's NVFP4 operand).
 */
#ifndef MS_FP4_H
#define MS_FP4_H

/* e2m1 by its bits (a table would live in local memory, one load a code):
 * exponent field e, mantissa bit m; e 0 is 0 or 0.5, else (1 + m/2) 2^(e-1) */
__device__ __forceinline__ float e2m1v(unsigned c)
{
	unsigned e = (c >> 1) & 3, m = c & 1;
	unsigned bits = e ? ((e + 126u) << 23) | (m << 22) : (m ? 0x3f000000u : 0u);
	return __int_as_float((int)(bits | ((c & 8u) << 28)));
}

__device__ __forceinline__ float e4m3v(unsigned b)
{
	unsigned e = (b >> 3) & 15, m = b & 7;
	float v;
	if ((b & 0x7f) == 0x7f)
		return __int_as_float(0x7fc00000);
	if (e == 0)
		v = (float)m * 0x1p-9f;
	else
		v = __int_as_float((int)(((e + 127u - 7u) << 23) | (m << 20)));
	return (b & 0x80) ? -v : v;
}

#endif
