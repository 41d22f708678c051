/*
 * t_stage.c: the one publish path (stage.h). A new output appears whole;
 * an existing one is replaced only when asked, kept beside until commit
 * and put back by abort; a failed or abandoned stage leaves no staging,
 * no created parent and no lock behind; the staging names are the ones
 * `msinv gc` recognises.
 */
#include "test.h"

#include <dirent.h>
#include <sys/stat.h>

#include "fsutil.h"
#include "stage.h"

/* Entries of dir whose name starts with '.' (other than . and ..). */
static int hidden_entries(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	int n = 0;

	if (!d)
		return -1;
	while ((de = readdir(d)))
		if (de->d_name[0] == '.' && strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			n++;
	closedir(d);
	return n;
}

static int put(const char *dir, const char *name, const char *text)
{
	char p[1024];
	FILE *f;

	snprintf(p, sizeof(p), "%s/%s", dir, name);
	if (!(f = fopen(p, "w")))
		return -1;
	fputs(text, f);
	return fclose(f);
}

static int holds(const char *dir, const char *name, const char *text)
{
	char p[1024], buf[64] = {0};
	FILE *f;
	size_t n;

	snprintf(p, sizeof(p), "%s/%s", dir, name);
	if (!(f = fopen(p, "r")))
		return 0;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	return n == strlen(text) && !memcmp(buf, text, n);
}

static int test_new_dir(void)
{
	struct ms_stage st;
	struct ms_err err = {0};
	char top[512], dest[600];
	long pid = 0;

	snprintf(top, sizeof(top), "%s/new", T_TMP);
	snprintf(dest, sizeof(dest), "%s/a/b/out", top);
	T_ASSERT_EQ_INT(mkdir(top, 0755), 0);
	T_ASSERT_MSG(ms_stage_open(&st, dest, "output", MS_STAGE_DIR | MS_STAGE_PARENTS, &err) ==
		     MS_OK, "%s", err.msg);
	/* the staging directory is beside the output, named by the gc rule */
	T_ASSERT(ms_temp_name_parse(ms_path_base(ms_stage_path(&st)), &pid));
	T_ASSERT_EQ_INT(pid, (long)getpid());
	T_ASSERT_EQ_INT(put(ms_stage_path(&st), "x.json", "new"), 0);
	T_ASSERT_MSG(ms_stage_publish(&st, MS_STAGE_NEW, &err) == MS_OK, "%s", err.msg);
	T_ASSERT(holds(dest, "x.json", "new"));
	/* not recorded: abort takes it away, with the parents it made */
	ms_stage_abort(&st);
	T_ASSERT(access(dest, F_OK) != 0);
	T_ASSERT_EQ_INT(hidden_entries(top), 0);
	snprintf(dest, sizeof(dest), "%s/a", top);
	T_ASSERT(access(dest, F_OK) != 0);
	/* a second abort, and one of a stage never opened, do nothing */
	ms_stage_abort(&st);
	ms_stage_init(&st);
	ms_stage_abort(&st);

	/* recorded: commit keeps it and the parents */
	snprintf(dest, sizeof(dest), "%s/a/b/out", top);
	T_ASSERT_EQ_INT(ms_stage_open(&st, dest, "output", MS_STAGE_DIR | MS_STAGE_PARENTS, &err),
			MS_OK);
	T_ASSERT_EQ_INT(put(ms_stage_path(&st), "x.json", "new"), 0);
	T_ASSERT_EQ_INT(ms_stage_publish(&st, MS_STAGE_NEW, &err), MS_OK);
	ms_stage_commit(&st);
	T_ASSERT(holds(dest, "x.json", "new"));
	snprintf(top, sizeof(top), "%s/new/a/b", T_TMP);
	T_ASSERT_EQ_INT(hidden_entries(top), 0);
	return 0;
}

static int test_replace_and_put_back(void)
{
	struct ms_stage st;
	struct ms_err err = {0};
	char top[512], dest[600];

	snprintf(top, sizeof(top), "%s/repl", T_TMP);
	snprintf(dest, sizeof(dest), "%s/out", top);
	T_ASSERT_EQ_INT(mkdir(top, 0755), 0);
	T_ASSERT_EQ_INT(mkdir(dest, 0755), 0);
	T_ASSERT_EQ_INT(put(dest, "x.json", "old"), 0);

	/* NEW never replaces: the other writer won, nothing changes */
	T_ASSERT_EQ_INT(ms_stage_open(&st, dest, "output", MS_STAGE_DIR, &err), MS_OK);
	T_ASSERT_EQ_INT(put(ms_stage_path(&st), "x.json", "new"), 0);
	T_ASSERT_EQ_INT(ms_stage_publish(&st, MS_STAGE_NEW, &err), MS_EEXIST);
	T_ASSERT_MSG(strstr(err.msg, "output appeared while writing (another writer won)") &&
		     strstr(err.msg, dest), "%s", err.msg);
	ms_stage_abort(&st);
	T_ASSERT(holds(dest, "x.json", "old"));
	T_ASSERT_EQ_INT(hidden_entries(top), 0);

	/* REPLACE, then abort (the record failed): the old one is back */
	T_ASSERT_EQ_INT(ms_stage_open(&st, dest, "output", MS_STAGE_DIR, &err), MS_OK);
	T_ASSERT_EQ_INT(put(ms_stage_path(&st), "x.json", "new"), 0);
	T_ASSERT_MSG(ms_stage_publish(&st, MS_STAGE_REPLACE, &err) == MS_OK, "%s", err.msg);
	T_ASSERT(holds(dest, "x.json", "new"));
	ms_stage_abort(&st);
	T_ASSERT(holds(dest, "x.json", "old"));
	T_ASSERT_EQ_INT(hidden_entries(top), 0);

	/* REPLACE, then commit: the new one stays, the old one is gone */
	T_ASSERT_EQ_INT(ms_stage_open(&st, dest, "output", MS_STAGE_DIR, &err), MS_OK);
	T_ASSERT_EQ_INT(put(ms_stage_path(&st), "x.json", "new"), 0);
	T_ASSERT_EQ_INT(ms_stage_publish(&st, MS_STAGE_REPLACE, &err), MS_OK);
	ms_stage_commit(&st);
	T_ASSERT(holds(dest, "x.json", "new"));
	T_ASSERT_EQ_INT(hidden_entries(top), 0);
	return 0;
}

static int test_file_and_lock(void)
{
	struct ms_stage st, other;
	struct ms_err err = {0};
	char top[512], dest[600];

	snprintf(top, sizeof(top), "%s/file", T_TMP);
	snprintf(dest, sizeof(dest), "%s/out.safetensors", top);
	T_ASSERT_EQ_INT(mkdir(top, 0755), 0);
	T_ASSERT_EQ_INT(ms_stage_open(&st, dest, "output", MS_STAGE_LOCK, &err), MS_OK);
	/* a file output's staging is created by its writer */
	T_ASSERT(access(ms_stage_path(&st), F_OK) != 0);
	/* a second writer beside it is refused at once */
	T_ASSERT_EQ_INT(ms_stage_open(&other, dest, "output", MS_STAGE_LOCK, &err), MS_EEXIST);
	T_ASSERT_MSG(strstr(err.msg, "another writer won"), "%s", err.msg);
	T_ASSERT_EQ_INT(ms_file_write_atomic(ms_stage_path(&st), "abc", 3, 0, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_stage_publish(&st, MS_STAGE_NEW, &err), MS_OK);
	ms_stage_commit(&st);
	T_ASSERT_EQ_INT(hidden_entries(top), 0);
	/* unlocked now */
	T_ASSERT_EQ_INT(ms_stage_open(&other, dest, "output", MS_STAGE_LOCK, &err), MS_OK);
	/* messages name the output, not the staging path */
	{
		char want[700];

		snprintf(want, sizeof(want), "'%s': write failed", dest);
		ms_err_set(&err, MS_EIO, "'%s': write failed", ms_stage_path(&other));
		ms_stage_fix_msg(&other, &err);
		T_ASSERT_STR(err.msg, want);
	}
	ms_stage_abort(&other);
	/* a name that is not one is refused */
	snprintf(dest, sizeof(dest), "%s/..", top);
	T_ASSERT_EQ_INT(ms_stage_open(&st, dest, "output", MS_STAGE_DIR, &err), MS_EINVAL);
	return 0;
}

static int test_temp_names(void)
{
	long pid = 0;
	char *n = ms_temp_name("/d", "model.safetensors", MS_ASIDE_MARKER);

	T_ASSERT(n != NULL);
	T_ASSERT(ms_temp_name_parse(ms_path_base(n), &pid));
	T_ASSERT_EQ_INT(pid, (long)getpid());
	ms_free(n);
	T_ASSERT(ms_temp_name_parse(".out.import-12-abcdef01", &pid) && pid == 12);
	T_ASSERT(ms_temp_name_parse(".a.tmp-b.tmp-7-0f", &pid) && pid == 7);
	T_ASSERT(!ms_temp_name_parse("out.tmp-12-ab", NULL));
	T_ASSERT(!ms_temp_name_parse("..tmp-12-ab", NULL));
	T_ASSERT(!ms_temp_name_parse(".out.tmp-0-ab", NULL));
	T_ASSERT(!ms_temp_name_parse(".out.tmp-12-xyz", NULL));
	T_ASSERT(!ms_temp_name_parse(".out.tmp-12-", NULL));
	return 0;
}

static int test_rmtree(void)
{
	char top[512], sub[600];

	snprintf(top, sizeof(top), "%s/rm", T_TMP);
	snprintf(sub, sizeof(sub), "%s/a/b", top);
	T_ASSERT_EQ_INT(ms_mkdir_p(sub, NULL), MS_OK);
	T_ASSERT_EQ_INT(put(sub, "f", "x"), 0);
	snprintf(sub, sizeof(sub), "%s/link", top);
	T_ASSERT_EQ_INT(symlink(T_TMP, sub), 0);
	T_ASSERT_EQ_INT(ms_rmtree(top), 0);
	T_ASSERT(access(top, F_OK) != 0);
	/* links are removed, not followed */
	T_ASSERT(access(T_TMP, F_OK) == 0);
	/* nothing there is no failure */
	T_ASSERT_EQ_INT(ms_rmtree(top), 0);
	return 0;
}

static const struct t_case cases[] = {
	T_CASE(test_new_dir),
	T_CASE(test_replace_and_put_back),
	T_CASE(test_file_and_lock),
	T_CASE(test_temp_names),
	T_CASE(test_rmtree),
};

T_MAIN(cases)
