/*
 * st_hash.c: the digests of safetensors files (header, every tensor and,
 * on demand, the whole file) in one pass of the hashing pool (hash.h).
 * Kept out of hash.c so that hashing knows nothing of file formats.
 */
#include "safetensors.h"

int ms_st_hash_files(struct ms_st_file **files, size_t nfiles, int nthreads,
		     int file_digests, struct ms_err *err)
{
	return ms_st_hash_files_ex(files, nfiles, nthreads, file_digests, 0, NULL, err);
}

int ms_st_hash_files_progress(struct ms_st_file **files, size_t nfiles, int nthreads,
			      int file_digests, const struct ms_progress *progress,
			      struct ms_err *err)
{
	return ms_st_hash_files_ex(files, nfiles, nthreads, file_digests, 0, progress, err);
}

int ms_st_hash_files_trees(struct ms_st_file **files, size_t nfiles, int nthreads,
			   int file_digests, int trees, struct ms_err *err)
{
	return ms_st_hash_files_ex(files, nfiles, nthreads, file_digests, trees, NULL, err);
}

int ms_st_hash_files_ex(struct ms_st_file **files, size_t nfiles, int nthreads,
			int file_digests, int trees, const struct ms_progress *progress,
			struct ms_err *err)
{
	struct ms_hash_job *jobs = NULL;
	size_t n = 0, k = 0;
	int rc;

	for (size_t i = 0; i < nfiles; i++)
		n += files[i]->ntensors + 1 + (file_digests ? 1 : 0);
	jobs = ms_calloc(n ? n : 1, sizeof(*jobs));
	if (!jobs)
		return ms_err_nomem(err);
	for (size_t i = 0; i < nfiles; i++) {
		struct ms_st_file *f = files[i];

		jobs[k].data = f->map;
		jobs[k].n = 8 + f->header_len;
		jobs[k++].digest = f->header_digest;
		for (size_t t = 0; t < f->ntensors; t++) {
			jobs[k].data = f->tensors[t].data;
			jobs[k].n = f->tensors[t].nbytes;
			jobs[k].tree = trees ? f->tensors[t].tree : NULL;
			jobs[k++].digest = f->tensors[t].digest;
		}
		if (file_digests) {
			jobs[k].data = f->map;
			jobs[k].n = f->size;
			jobs[k++].digest = f->file_digest;
		}
	}
	rc = ms_hash_run_progress(jobs, k, nthreads, progress, err);
	if (rc == MS_OK) {
		for (size_t i = 0; i < nfiles; i++) {
			files[i]->has_header_digest = 1;
			if (file_digests)
				files[i]->has_file_digest = 1;
			for (size_t t = 0; t < files[i]->ntensors; t++) {
				files[i]->tensors[t].has_digest = 1;
				files[i]->tensors[t].has_tree = trees;
			}
		}
	}
	ms_free(jobs);
	return rc;
}
