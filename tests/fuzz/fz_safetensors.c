/*
 * fz_safetensors.c: fuzz target for the strict safetensors reader
 * (ms_st_parse). The input is a whole file image. A valid image is walked
 * completely (every tensor looked up by name, every element decoded,
 * metadata read back), so an accepted header that points past the buffer
 * shows up as an out-of-bounds read under AddressSanitizer; a rejected one
 * must leave one error line.
 */
#include <assert.h>
#include <stdint.h>
#include <string.h>

#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct ms_st_file *f = NULL;
	struct ms_err err = {0};
	uint64_t pos;
	int rc;

	rc = ms_st_parse(data, size, "fuzz.safetensors", &f, &err);
	if (rc != MS_OK) {
		/* a rejection names the file and stays one line */
		assert(f == NULL);
		assert(err.code == rc);
		assert(strstr(err.msg, "fuzz.safetensors") != NULL);
		assert(strchr(err.msg, '\n') == NULL);
		/* and is the same without an error buffer */
		assert(ms_st_parse(data, size, "fuzz.safetensors", &f, NULL) == rc);
		assert(f == NULL);
		return 0;
	}
	assert(f->header_len + 8 <= size);
	pos = 8 + f->header_len;
	for (size_t i = 0; i < f->ntensors; i++) {
		const struct ms_tensor *t = &f->tensors[i];
		uint64_t ne = 1;
		double v, acc = 0;

		/* in offset order, back to back, inside the buffer */
		assert(t->offset == pos);
		assert(t->nbytes <= size - pos);
		assert(t->data == data + t->offset);
		pos += t->nbytes;
		assert(t->ndim <= MS_ST_MAX_RANK);
		for (uint32_t d = 0; d < t->ndim; d++)
			ne *= t->shape[d];
		assert(ne == t->nelem);
		assert(*t->name && strlen(t->name) <= MS_ST_MAX_NAME);
		assert(ms_st_find(f, t->name) == t);
		if (t->dtype != MS_DTYPE_C64)
			for (uint64_t k = 0; k < t->nelem; k++)
				if (ms_dtype_get_f64(t->dtype, t->data, k, &v) == MS_OK)
					acc += v != v ? 0 : 1;
		(void)acc;
	}
	assert(pos == size);
	for (size_t i = 0; i < f->nmeta; i++)
		assert(ms_st_meta_get(f, f->meta[i].key) != NULL);
	ms_st_close(f);
	return 0;
}
