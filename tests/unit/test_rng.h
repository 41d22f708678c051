/*
 * test_rng.h: the kernel tests' fixed random stream (xorshift, the same
 * values on every run) and normal samples from it.
 */
#ifndef MS_TEST_RNG_H
#define MS_TEST_RNG_H

#include <math.h>
#include <stdint.h>

static uint64_t rng = 0x243f6a8885a308d3ull;

static uint64_t rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

static double gauss(void)
{
	double u = (double)(rnd() >> 11) * 0x1p-53 + 1e-12;
	double v = (double)(rnd() >> 11) * 0x1p-53;

	return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

#endif
