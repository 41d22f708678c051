-- 0001-initial.sql: the first schema of the msinv inventory (see ms(5)).
--
-- Applied by src/inventory.c inside one BEGIN IMMEDIATE transaction that
-- also sets PRAGMA application_id and PRAGMA user_version = 1. Every table is
-- STRICT; foreign keys are enforced (the library turns them on per
-- connection). Digests are lowercase hex; times are UTC ISO 8601 text with
-- microseconds ("2025-01-31T12:00:00.000000Z"), so they sort as text.

-- A file as it was when recorded. A path whose bytes changed gets a second
-- row (another content digest): the states recorded with the first keep
-- their tensors and fail verification, as they must. The stat fields are
-- the "unchanged since" key that lets a re-add skip hashing.
CREATE TABLE files (
	id             INTEGER PRIMARY KEY,
	path           TEXT    NOT NULL CHECK (substr(path, 1, 1) = '/'),
	size           INTEGER NOT NULL CHECK (size >= 8),
	mtime_ns       INTEGER NOT NULL,
	ctime_ns       INTEGER NOT NULL,
	dev            INTEGER NOT NULL,
	inode          INTEGER NOT NULL,
	header_len     INTEGER NOT NULL CHECK (header_len >= 0),
	header_digest  TEXT    NOT NULL CHECK (length(header_digest) = 64),
	content_digest TEXT    NOT NULL CHECK (length(content_digest) = 64),
	file_digest    TEXT             CHECK (file_digest IS NULL OR length(file_digest) = 64),
	ntensors       INTEGER NOT NULL CHECK (ntensors >= 0),
	added_at       TEXT    NOT NULL,
	UNIQUE (path, content_digest)
) STRICT;

-- Every tensor of a recorded file. byte_offset is absolute in the file.
CREATE TABLE tensors (
	id          INTEGER PRIMARY KEY,
	file_id     INTEGER NOT NULL REFERENCES files(id) ON DELETE CASCADE,
	name        TEXT    NOT NULL,
	dtype       TEXT    NOT NULL,
	shape       TEXT    NOT NULL,
	byte_offset INTEGER NOT NULL CHECK (byte_offset >= 8),
	nbytes      INTEGER NOT NULL CHECK (nbytes >= 0),
	digest      TEXT    NOT NULL CHECK (length(digest) = 64),
	UNIQUE (file_id, name)
) STRICT;
CREATE INDEX tensors_digest ON tensors(digest);

-- A weight state, named by its digest (the identity rule in ms(5)).
CREATE TABLE states (
	id         INTEGER PRIMARY KEY,
	digest     TEXT    NOT NULL UNIQUE
	                   CHECK (length(digest) = 71 AND substr(digest, 1, 7) = 'sha256:'),
	kind       TEXT    NOT NULL
	                   CHECK (kind IN ('base', 'quantized', 'adapter', 'adapter_shard', 'policy')),
	layout     TEXT    NOT NULL CHECK (layout <> ''),
	label      TEXT    UNIQUE,
	ntensors   INTEGER NOT NULL CHECK (ntensors >= 0),
	nbytes     INTEGER NOT NULL CHECK (nbytes >= 0),
	ep_size    INTEGER,
	ep_rank    INTEGER,
	experts    TEXT,
	tool       TEXT    NOT NULL,
	argv       TEXT    NOT NULL,
	user       TEXT    NOT NULL,
	host       TEXT    NOT NULL,
	created_at TEXT    NOT NULL,
	CHECK ((ep_size IS NULL) = (ep_rank IS NULL)),
	CHECK (ep_size IS NULL OR (ep_size >= 1 AND ep_rank >= 0 AND ep_rank < ep_size)),
	CHECK ((kind = 'adapter_shard') = (ep_size IS NOT NULL))
) STRICT;
CREATE INDEX states_kind ON states(kind);

-- Where a state's bytes are: each copy (location) is a set of files that
-- holds every tensor of the state once. name is the file's name inside the
-- checkpoint (model-00001-of-00002.safetensors), which the realpath of a
-- Hugging Face cache link does not keep.
CREATE TABLE state_files (
	state_id INTEGER NOT NULL REFERENCES states(id) ON DELETE CASCADE,
	copy     INTEGER NOT NULL CHECK (copy >= 1),
	file_id  INTEGER NOT NULL REFERENCES files(id),
	name     TEXT    NOT NULL,
	PRIMARY KEY (state_id, copy, file_id)
) STRICT;
CREATE INDEX state_files_file ON state_files(file_id);

-- The configuration files found beside a copy, with their bytes.
CREATE TABLE state_configs (
	state_id INTEGER NOT NULL REFERENCES states(id) ON DELETE CASCADE,
	copy     INTEGER NOT NULL CHECK (copy >= 1),
	name     TEXT    NOT NULL,
	path     TEXT    NOT NULL,
	digest   TEXT    NOT NULL CHECK (length(digest) = 64),
	content  TEXT    NOT NULL,
	PRIMARY KEY (state_id, copy, name)
) STRICT;

CREATE TABLE runs (
	id          INTEGER PRIMARY KEY,
	plan_digest TEXT    NOT NULL,
	status      TEXT    NOT NULL CHECK (status IN ('running', 'ok', 'failed')),
	exit_code   INTEGER,
	started_at  TEXT    NOT NULL,
	ended_at    TEXT,
	tool        TEXT    NOT NULL,
	argv        TEXT    NOT NULL,
	user        TEXT    NOT NULL,
	host        TEXT    NOT NULL
) STRICT;

-- child was made from parent by operation (quantize, transpose, split, ...)
-- with params (a JSON object).
CREATE TABLE derivations (
	child_id   INTEGER NOT NULL REFERENCES states(id) ON DELETE CASCADE,
	parent_id  INTEGER NOT NULL REFERENCES states(id) ON DELETE CASCADE,
	operation  TEXT    NOT NULL,
	params     TEXT    NOT NULL,
	run_id     INTEGER REFERENCES runs(id) ON DELETE SET NULL,
	created_at TEXT    NOT NULL,
	PRIMARY KEY (child_id, parent_id, operation),
	CHECK (child_id <> parent_id)
) STRICT;
CREATE INDEX derivations_parent ON derivations(parent_id);

CREATE TABLE verifications (
	id       INTEGER PRIMARY KEY,
	state_id INTEGER NOT NULL REFERENCES states(id) ON DELETE CASCADE,
	at       TEXT    NOT NULL,
	host     TEXT    NOT NULL,
	user     TEXT    NOT NULL,
	tool     TEXT    NOT NULL,
	result   TEXT    NOT NULL CHECK (result IN ('ok', 'mismatch', 'missing', 'error')),
	nbytes   INTEGER NOT NULL CHECK (nbytes >= 0),
	seconds  REAL    NOT NULL CHECK (seconds >= 0),
	detail   TEXT
) STRICT;
CREATE INDEX verifications_state ON verifications(state_id);

-- The states a run consumed, with the state digest verified before it ran
-- (kept when the state row is removed), and the states it produced.
CREATE TABLE run_inputs (
	run_id   INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
	digest   TEXT    NOT NULL CHECK (length(digest) = 71),
	state_id INTEGER REFERENCES states(id) ON DELETE SET NULL,
	role     TEXT,
	PRIMARY KEY (run_id, digest)
) STRICT;
CREATE INDEX run_inputs_state ON run_inputs(state_id);

CREATE TABLE run_outputs (
	run_id   INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
	digest   TEXT    NOT NULL CHECK (length(digest) = 71),
	state_id INTEGER REFERENCES states(id) ON DELETE SET NULL,
	PRIMARY KEY (run_id, digest)
) STRICT;
CREATE INDEX run_outputs_state ON run_outputs(state_id);

-- Things a run reports (reward_collapse, ...): kind and a JSON object.
CREATE TABLE events (
	id     INTEGER PRIMARY KEY,
	run_id INTEGER REFERENCES runs(id) ON DELETE CASCADE,
	at     TEXT    NOT NULL,
	kind   TEXT    NOT NULL CHECK (kind <> ''),
	data   TEXT    NOT NULL
) STRICT;
CREATE INDEX events_run ON events(run_id);

-- The audit log: one entry per change, chained. hash is the SHA-256 of the
-- entry's canonical encoding (ms(5)), which starts with prev_hash, the hash
-- of the entry before (64 zeros for the first). log_head holds the newest
-- entry, so removing entries at the end is detected too.
CREATE TABLE log (
	seq       INTEGER PRIMARY KEY CHECK (seq >= 1),
	at        TEXT    NOT NULL,
	user      TEXT    NOT NULL,
	host      TEXT    NOT NULL,
	tool      TEXT    NOT NULL,
	argv      TEXT    NOT NULL,
	action    TEXT    NOT NULL,
	subject   TEXT    NOT NULL,
	detail    TEXT    NOT NULL,
	prev_hash TEXT    NOT NULL CHECK (length(prev_hash) = 64),
	hash      TEXT    NOT NULL CHECK (length(hash) = 64)
) STRICT;

CREATE TABLE log_head (
	one  INTEGER PRIMARY KEY CHECK (one = 1),
	seq  INTEGER NOT NULL CHECK (seq >= 0),
	hash TEXT    NOT NULL CHECK (length(hash) = 64)
) STRICT;
INSERT INTO log_head (one, seq, hash)
	VALUES (1, 0, '0000000000000000000000000000000000000000000000000000000000000000');

-- Append-only: the library never updates or deletes an entry. (Someone with
-- the sqlite3 shell can drop these; the chain still shows what they did.)
CREATE TRIGGER log_no_update BEFORE UPDATE ON log
BEGIN
	SELECT RAISE(ABORT, 'the audit log is append-only');
END;
CREATE TRIGGER log_no_delete BEFORE DELETE ON log
BEGIN
	SELECT RAISE(ABORT, 'the audit log is append-only');
END;
