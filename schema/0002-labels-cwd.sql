-- 0002-labels-cwd.sql: several labels per state, and the working directory
-- of every change (see ms(5)).
--
-- A label is a name for a state, as a git tag is for a commit: a state may
-- have several, a label names one state. labels is where names are looked
-- up; states.label stays the state's first label (the one ls, show and
-- lineage print first), kept by the library as the oldest of its labels.

CREATE TABLE labels (
	name       TEXT    PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 128),
	state_id   INTEGER NOT NULL REFERENCES states(id) ON DELETE CASCADE,
	created_at TEXT    NOT NULL
) STRICT;
CREATE INDEX labels_state ON labels(state_id);
INSERT INTO labels (name, state_id, created_at)
	SELECT label, id, created_at FROM states WHERE label IS NOT NULL;

-- The working directory of the command that made the change, so that the
-- relative paths of its argv (recorded as typed) can be read. NULL for rows
-- written before this migration.
ALTER TABLE states ADD COLUMN cwd TEXT;
ALTER TABLE log ADD COLUMN cwd TEXT;
