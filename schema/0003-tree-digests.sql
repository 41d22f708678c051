-- 0003-tree-digests.sql: chunk-tree digests of tensor bytes (see ms(5),
-- "Tree digests").
--
-- A tree digest is a function of the bytes alone, like the plain SHA-256
-- that names them, so it is recorded per plain digest: every tensor with
-- those bytes, in any file or state, gains it at once. A row is written
-- only by a pass that computed both digests over the same bytes (msinv add,
-- msverify files when the plain digest matched), or from a device copy
-- whose tree agreed with one the CPU computed in the same pass; the
-- library never updates a row, and a second, different tree for the same
-- bytes is refused. Databases made before this migration have no rows and
-- gain them as their states are verified.
CREATE TABLE tree_digests (
	digest      TEXT    NOT NULL
	                    CHECK (length(digest) = 64 AND digest NOT GLOB '*[^0-9a-f]*'),
	chunk_log2  INTEGER NOT NULL CHECK (chunk_log2 BETWEEN 10 AND 30),
	nbytes      INTEGER NOT NULL CHECK (nbytes >= 0),
	tree        TEXT    NOT NULL
	                    CHECK (length(tree) = 64 AND tree NOT GLOB '*[^0-9a-f]*'),
	source      TEXT    NOT NULL CHECK (source IN ('add', 'verify', 'load')),
	recorded_at TEXT    NOT NULL,
	PRIMARY KEY (digest, chunk_log2)
) STRICT;

CREATE TRIGGER tree_digests_no_update BEFORE UPDATE ON tree_digests
BEGIN
	SELECT RAISE(ABORT, 'a recorded tree digest is never changed');
END;
