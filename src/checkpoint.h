/*
 * checkpoint.h: a set of safetensors files read as one model state.
 *
 * Accepted inputs: a .safetensors file; a directory holding
 * model.safetensors.index.json (sharded), or exactly the safetensors files
 * it holds (model.safetensors, adapter_model.safetensors, or any other set
 * with no index); several such paths at once (ms_ckpt_open_many). Files may
 * be symbolic links, as in a Hugging Face cache snapshot whose links point
 * into blobs/<sha256>; the blob name is kept and checked when whole-file
 * digests are computed.
 *
 * Index rules: JSON object with "weight_map" (name -> file); file names are
 * plain names inside the directory (no '/', no '..'); every listed file
 * exists; every tensor in the map is found exactly once, in the file the
 * map names, and no file holds a tensor the map does not list.
 *
 * Configuration files that change how tensors are read (config.json,
 * hf_quant_config.json, adapter_config.json, quantization_config.json,
 * ep_manifest.json) are recorded with their SHA-256. So is every other
 * file a directory holds that a loader or server needs beside the weights
 * (tokenizer.json, tokenizer_config.json, special_tokens_map.json,
 * generation_config.json, chat templates, README.md, ...): every regular
 * file (or link to one) directly in the directory except hidden names, the
 * safetensors files and their index, MANIFEST.json (an import's own), and
 * weights of other formats (MS_CKPT_WEIGHT_SUFFIXES). Those are the "side
 * files" (side = 1): copied by split, merge and reshard, packed by export,
 * checked by verify, as configuration files are. Two paths of one state
 * may hold the same side file (same name, same bytes); different bytes
 * under one name are refused.
 */
#ifndef MS_CHECKPOINT_H
#define MS_CHECKPOINT_H

#include "common.h"
#include "safetensors.h"

#define MS_CKPT_MAX_INDEX (256u * 1024u * 1024u)
#define MS_CKPT_MAX_CONFIG (16u * 1024u * 1024u)
/* A side file is read whole too (tokenizer.json of a 256k vocabulary is
 * tens of megabytes). */
#define MS_CKPT_MAX_SIDE (256u * 1024u * 1024u)
/* Weights in formats other than safetensors, never side files. */
#define MS_CKPT_WEIGHT_SUFFIXES \
	".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack", ".onnx", \
	".npz", ".npy", ".pkl", ".safetensors.index.json", ".bin.index.json"

struct ms_ckpt_config {
	char *name;   /* file name, e.g. "adapter_config.json" */
	char *path;
	char *text;   /* whole file, NUL-terminated */
	size_t len;
	uint8_t digest[MS_SHA256_LEN];
	int side;     /* a side file, not a configuration file (see above) */
};

struct ms_ckpt {
	size_t nfiles;
	struct ms_st_file **files;
	char **file_names;            /* relative to the directory; parallel */
	size_t ntensors;
	struct ms_tensor **tensors;   /* every tensor, sorted bytewise by name */
	size_t nconfigs;
	struct ms_ckpt_config *configs;
	char *index_path;             /* NULL without an index */
	int is_adapter;               /* adapter_config.json present */
};

int ms_ckpt_open(const char *path, struct ms_ckpt **out, struct ms_err *err);
int ms_ckpt_open_many(const char *const *paths, size_t n, struct ms_ckpt **out,
		      struct ms_err *err);
void ms_ckpt_close(struct ms_ckpt *c);
const struct ms_tensor *ms_ckpt_find(const struct ms_ckpt *c, const char *name);
const struct ms_ckpt_config *ms_ckpt_config(const struct ms_ckpt *c,
					    const char *name);
/* Hash all tensors and headers (and files, with file_digests); files that
 * are links into a blob store must match their blob names (MS_ECHECK). */
int ms_ckpt_hash(struct ms_ckpt *c, int nthreads, int file_digests,
		 struct ms_err *err);

/*
 * State identity: "sha256:" + hex SHA-256 of the canonical manifest
 *   msinv-state-v1\n
 *   <name>\t<DTYPE>\t[<d0>,<d1>,...]\t<hex tensor digest>\n   (sorted by name)
 * Requires every tensor hashed. out must hold MS_STATE_DIGEST_LEN bytes.
 */
#define MS_STATE_DIGEST_LEN (7 + 64 + 1)
int ms_state_digest(struct ms_tensor *const *tensors, size_t n,
		    char out[MS_STATE_DIGEST_LEN], struct ms_err *err);
/* The canonical manifest text itself (caller frees). */
int ms_state_manifest(struct ms_tensor *const *tensors, size_t n, char **text,
		      size_t *len, struct ms_err *err);
/* "[d0,d1]" shape text into buf (at least 24*MS_ST_MAX_RANK bytes). */
void ms_shape_str(const struct ms_tensor *t, char *buf, size_t n);

#endif
