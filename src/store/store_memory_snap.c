/*
 * store_memory_snap -- the memory store's snapshot file (see store_memory_int.h).
 *
 * Snapshot file (all integers little-endian):
 *   header  "SLUICESNAP1\n" (12 bytes), u32 version = 2, u64 seed, u64 record count
 *   records count x { u64 hash (never 0), u64 tat }
 *   version 2 only, the run-time limits (store_ov.c):
 *           u64 entry count (<= STORE_OV_MAX), then per entry
 *           { u64 key_hash, u64 until (0: until unset), u32 nwin (0..4),
 *             nwin x { u64 count, u64 period_ns, u64 burst } (each > 0),
 *             u32 rule length (1..63), rule bytes, u32 key length (1..512), key bytes }
 *   end     { u64 0, u64 XXH64(everything before the end, seed 0) }
 * Version 1 files (no run-time limits section) still load.  The seed is the store's
 * key-hash seed: restored with the records, it keeps every key_hash the same across a
 * restart (an entry's key_hash must be store_key_hash(rule, key) under it, or the file is
 * refused).  Written to "<path>.tmp", fsynced, renamed over <path>, and the directory
 * fsynced.  Only records whose TAT is still ahead, and entries not expired, are written;
 * the whole image is checked before anything is loaded.
 */
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include "log.h"
#include "store_memory_int.h"
#include "util.h"

/* ---- snapshot -------------------------------------------------------------------------- */

static inline void put_le64(unsigned char *p, uint64_t v)
{
	v = htole64(v);
	memcpy(p, &v, 8);
}

static inline uint64_t get_le64(const unsigned char *p)
{
	uint64_t v;
	memcpy(&v, p, 8);
	return le64toh(v);
}

static inline void put_le32(unsigned char *p, uint32_t v)
{
	v = htole32(v);
	memcpy(p, &v, 4);
}

static inline uint32_t get_le32(const unsigned char *p)
{
	uint32_t v;
	memcpy(&v, p, 4);
	return le32toh(v);
}

/* The bytes of the run-time limits section for e[0..n). */
static size_t snap_ov_size(const struct store_ov_entry *e, size_t n)
{
	size_t len = 8;
	for (size_t i = 0; i < n; i++)
		len += 8 + 8 + 4 + 24 * (size_t)e[i].limits.n + 4 + e[i].rule.len + 4 + e[i].key.len;
	return len;
}

static size_t snap_ov_write(unsigned char *p, const struct store_ov_entry *e, size_t n)
{
	size_t len = 0;
	put_le64(p, n);
	len += 8;
	for (size_t i = 0; i < n; i++) {
		put_le64(p + len, e[i].key_hash);
		put_le64(p + len + 8, e[i].until_ns);
		put_le32(p + len + 16, e[i].limits.n);
		len += 20;
		for (unsigned w = 0; w < e[i].limits.n; w++) {
			put_le64(p + len, e[i].limits.w[w].count);
			put_le64(p + len + 8, e[i].limits.w[w].period_ns);
			put_le64(p + len + 16, e[i].limits.w[w].burst);
			len += 24;
		}
		put_le32(p + len, (uint32_t)e[i].rule.len);
		memcpy(p + len + 4, e[i].rule.ptr, e[i].rule.len);
		len += 4 + e[i].rule.len;
		put_le32(p + len, (uint32_t)e[i].key.len);
		memcpy(p + len + 4, e[i].key.ptr, e[i].key.len);
		len += 4 + e[i].key.len;
	}
	return len;
}

/*
 * Decode the run-time limits section p[0..n) (exactly: nothing may follow it), each
 * key_hash checked against its rule and key under seed.  0 and *ret_n (entries into
 * ret[] if not NULL, pointing into p), or -EINVAL with *why.
 */
static int snap_ov_decode(const unsigned char *p, size_t n, uint64_t seed,
			  struct store_ov_entry *ret, size_t *ret_n, const char **why)
{
	*why = "run-time limits: truncated";
	if (n < 8)
		return -EINVAL;
	uint64_t count = get_le64(p);
	if (count > STORE_OV_MAX || count > (n - 8) / SNAP_OV_MIN) {
		*why = "run-time limits: bad count";
		return -EINVAL;
	}
	size_t off = 8;
	for (uint64_t i = 0; i < count; i++) {
		struct store_ov_entry e = { 0 };
		if (n - off < 20)
			return -EINVAL;
		e.key_hash = get_le64(p + off);
		e.until_ns = get_le64(p + off + 8);
		uint32_t nwin = get_le32(p + off + 16);
		off += 20;
		if (nwin > RATE_MAX_WINDOWS) {
			*why = "run-time limits: too many windows";
			return -EINVAL;
		}
		if ((n - off) / 24 < nwin)
			return -EINVAL;
		e.limits.n = nwin;
		for (unsigned w = 0; w < nwin; w++) {
			e.limits.w[w].count = get_le64(p + off);
			e.limits.w[w].period_ns = get_le64(p + off + 8);
			e.limits.w[w].burst = get_le64(p + off + 16);
			off += 24;
		}
		for (int part = 0; part < 2; part++) {
			if (n - off < 4)
				return -EINVAL;
			uint32_t len = get_le32(p + off);
			off += 4;
			if (len == 0 || len > (part ? RATE_MAX_OVERRIDE_KEY : STORE_OV_RULE)) {
				*why = "run-time limits: bad rule or key length";
				return -EINVAL;
			}
			if (n - off < len)
				return -EINVAL;
			*(part ? &e.key : &e.rule) = str_make((const char *)p + off, len);
			off += len;
		}
		if (!store_ov_entry_valid(&e)) {
			*why = "run-time limits: bad entry";
			return -EINVAL;
		}
		if (store_key_hash_seed(seed, e.rule, e.key) != e.key_hash) {
			*why = "run-time limits: key hash does not match";
			return -EINVAL;
		}
		if (ret)
			ret[i] = e;
	}
	if (off != n) {
		*why = "run-time limits: trailing bytes";
		return -EINVAL;
	}
	*ret_n = (size_t)count;
	return 0;
}

/* The whole image in memory: 16 bytes per live record for as long as the write takes. */
static int snapshot_build(struct store_memory *m, uint64_t now, unsigned char **ret,
			  size_t *ret_len)
{
	struct store_ov_entry *ov = NULL;
	size_t nov = 0;
	if (m->store->ov && store_ov_list(m->store->ov, now, &ov, &nov) < 0)
		return -ENOMEM;
	size_t ov_len = snap_ov_size(ov, nov);
	size_t cap = SNAP_HEADER + SNAP_RECORD * (atomic_load(&m->total) + 64) + SNAP_RECORD +
		     ov_len;
	unsigned char *p = malloc(cap);
	if (!p) {
		free(ov);
		return -ENOMEM;
	}
	size_t len = SNAP_HEADER;
	uint64_t count = 0;
	for (unsigned s = 0; s < SHARDS; s++) {
		struct shard *sh = &m->shards[s];
		shard_lock(sh);
		while (len + SNAP_RECORD * (sh->count + 1) + ov_len > cap) {
			/* grow without holding the shard: the copy may be large */
			size_t need = len + SNAP_RECORD * (sh->count + 1) + ov_len;
			shard_unlock(sh);
			size_t ncap = cap * 2 > need + need / 8 ? cap * 2 : need + need / 8;
			unsigned char *q = realloc(p, ncap);
			if (!q) {
				free(p);
				free(ov);
				return -ENOMEM;
			}
			p = q;
			cap = ncap;
			shard_lock(sh);
		}
		for (size_t i = 0; i <= sh->mask; i++) {
			const struct rec *x = &sh->slots[i];
			if (x->hash == 0 || x->tat <= now)
				continue;
			put_le64(p + len, x->hash);
			put_le64(p + len + 8, x->tat);
			len += SNAP_RECORD;
			count++;
		}
		shard_unlock(sh);
	}
	memcpy(p, SNAP_MAGIC, SNAP_MAGIC_LEN);
	put_le32(p + SNAP_MAGIC_LEN, SNAP_VERSION);
	put_le64(p + 16, m->store->seed);
	put_le64(p + 24, count);
	len += snap_ov_write(p + len, ov, nov);
	free(ov);
	put_le64(p + len, 0);
	put_le64(p + len + 8, XXH64(p, len, 0));
	len += SNAP_RECORD;
	*ret = p;
	*ret_len = len;
	return 0;
}

static int write_all(int fd, const unsigned char *p, size_t n)
{
	while (n) {
		ssize_t w = write(fd, p, n);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

static int fsync_dir_of(const char *path)
{
	const char *slash = strrchr(path, '/');
	char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
	if (!dir)
		return -ENOMEM;
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	free(dir);
	if (fd < 0)
		return -errno;
	int rc = fsync(fd) < 0 ? -errno : 0;
	close(fd);
	return rc;
}

/* Write path atomically: "<path>.tmp", fsync, rename, fsync of the directory. */
static int write_atomic(const char *path, const unsigned char *p, size_t n, char *err,
			size_t errlen)
{
	size_t plen = strlen(path);
	char *tmp = malloc(plen + 5);
	if (!tmp) {
		fmt_fixed(err, errlen, "snapshot %.200s: out of memory", path);
		return -ENOMEM;
	}
	memcpy(tmp, path, plen);
	memcpy(tmp + plen, ".tmp", 5);
	const char *step = "open";
	int rc = 0;
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0) {
		rc = -errno;
		goto fail;
	}
	step = "write";
	rc = write_all(fd, p, n);
	if (rc == 0) {
		step = "fsync";
		rc = fsync(fd) < 0 ? -errno : 0;
	}
	if (close(fd) < 0 && rc == 0) {
		step = "close";
		rc = -errno;
	}
	if (rc < 0)
		goto fail_unlink;
	step = "rename";
	if (rename(tmp, path) < 0) {
		rc = -errno;
		goto fail_unlink;
	}
	free(tmp);
	rc = fsync_dir_of(path);
	if (rc < 0)
		fmt_fixed(err, errlen, "snapshot %.200s: fsync of the directory: %s", path,
			  strerror(-rc));
	return rc;
fail_unlink:
	unlink(tmp);
fail:
	fmt_fixed(err, errlen, "snapshot %.200s: %s %.200s: %s", path, step, tmp, strerror(-rc));
	free(tmp);
	return rc;
}

int store_memory_snap_save(void *ctx, char *err, size_t errlen)
{
	struct store_memory *m = ctx;
	if (errlen)
		err[0] = '\0';
	if (!m->snapshot)
		return 0;
	pthread_mutex_lock(&m->save_lock);
	unsigned char *p;
	size_t n;
	int rc = snapshot_build(m, realtime_ns(), &p, &n);
	if (rc < 0) {
		fmt_fixed(err, errlen, "snapshot %.200s: out of memory", m->snapshot);
	} else {
		rc = write_atomic(m->snapshot, p, n, err, errlen);
		free(p);
	}
	pthread_mutex_unlock(&m->save_lock);
	return rc;
}

/* Check a whole image; 0 and the end of its records, or -EINVAL with *why. */
static int snapshot_check(const unsigned char *p, size_t n, size_t *ret_records_end,
			  const char **why)
{
	if (n < SNAP_HEADER + SNAP_RECORD) {
		*why = "truncated";
		return -EINVAL;
	}
	if (memcmp(p, SNAP_MAGIC, SNAP_MAGIC_LEN) != 0) {
		*why = "not a sluice snapshot (bad magic)";
		return -EINVAL;
	}
	uint32_t version = get_le32(p + SNAP_MAGIC_LEN);
	if (version != 1 && version != SNAP_VERSION) {
		*why = "unknown version";
		return -EINVAL;
	}
	uint64_t count = get_le64(p + 24);
	size_t end = n - SNAP_RECORD;
	size_t records_end;
	if (version == 1) {
		if ((n - SNAP_HEADER) % SNAP_RECORD != 0 ||
		    count != (n - SNAP_HEADER) / SNAP_RECORD - 1) {
			*why = "truncated, or its record count does not match its size";
			return -EINVAL;
		}
		records_end = end;
	} else {
		if (count > (end - SNAP_HEADER) / SNAP_RECORD) {
			*why = "truncated, or its record count does not match its size";
			return -EINVAL;
		}
		records_end = SNAP_HEADER + (size_t)count * SNAP_RECORD;
	}
	if (get_le64(p + end) != 0 || get_le64(p + end + 8) != XXH64(p, end, 0)) {
		*why = "checksum mismatch";
		return -EINVAL;
	}
	for (size_t off = SNAP_HEADER; off < records_end; off += SNAP_RECORD)
		if (get_le64(p + off) == 0) {
			*why = "record with hash 0";
			return -EINVAL;
		}
	if (version != 1) {
		size_t nov;
		if (snap_ov_decode(p + records_end, end - records_end, get_le64(p + 16), NULL,
				   &nov, why) < 0)
			return -EINVAL;
	}
	*ret_records_end = records_end;
	return 0;
}

static int load_image(struct store *s, const void *image, size_t n, uint64_t now,
		      const char **why)
{
	struct store_memory *m = s->ctx;
	const unsigned char *p = image;
	size_t records_end;
	int rc = snapshot_check(p, n, &records_end, why);
	if (rc < 0)
		return rc;
	/* the run-time limits are decoded (checked already) before anything is loaded, so
	 * that running out of memory leaves the store as it was */
	struct store_ov_entry *ov = NULL;
	size_t nov = 0;
	if (records_end != n - SNAP_RECORD) {
		uint64_t cnt = get_le64(p + records_end);
		ov = malloc((cnt ? (size_t)cnt : 1) * sizeof(*ov));
		if (!ov) {
			*why = "out of memory";
			return -ENOMEM;
		}
		if (snap_ov_decode(p + records_end, n - SNAP_RECORD - records_end,
				   get_le64(p + 16), ov, &nov, why) < 0) {
			free(ov);
			return -EINVAL;
		}
	}
	s->seed = get_le64(p + 16);
	if (nov && s->ov) {
		rc = store_ov_replace(s->ov, ov, nov, now);
		if (rc < 0) {
			free(ov);
			*why = rc == -ENOMEM ? "out of memory" : "run-time limits: too many";
			return rc == -ENOMEM ? rc : -EINVAL;
		}
	}
	free(ov);
	uint64_t max = atomic_load(&m->max_keys);
	for (size_t off = SNAP_HEADER; off < records_end; off += SNAP_RECORD) {
		uint64_t h = get_le64(p + off), tat = get_le64(p + off + 8);
		if (tat <= now)
			continue;
		struct shard *sh = &m->shards[shard_of(h)];
		shard_lock(sh);
		long slot = shard_find(sh, h);
		if (slot >= 0) {
			/* the same record twice: keep the stricter */
			if (tat > sh->slots[slot].tat)
				sh->slots[slot].tat = tat;
		} else if (atomic_load(&m->total) < max) {
			if (shard_reserve(sh, sh->count + 1) < 0) {
				shard_unlock(sh);
				*why = "out of memory";
				return -ENOMEM;
			}
			shard_insert(sh, h, tat);
			atomic_fetch_add(&m->total, 1);
		}
		shard_unlock(sh);
	}
	return 0;
}

int store_memory_load_buffer(struct store *s, const void *p, size_t n, uint64_t now)
{
	const char *why;
	return load_image(s, p, n, now, &why);
}

/*
 * Load conf->snapshot if it exists.  Anything unusable is renamed to "<path>.corrupt"
 * (replacing an older one) so the next save does not destroy the evidence, and the store
 * starts empty.
 */
void store_memory_snap_load_file(struct store *s, const char *path, uint64_t now, char *warn,
			       size_t warnlen)
{
	const char *why = NULL;
	char reason[160];
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		if (errno == ENOENT)
			return;
		fmt_fixed(reason, sizeof(reason), "cannot be opened: %s", strerror(errno));
		why = reason;
	} else {
		struct stat st;
		if (fstat(fd, &st) < 0) {
			fmt_fixed(reason, sizeof(reason), "cannot be read: %s", strerror(errno));
			why = reason;
		} else if (!S_ISREG(st.st_mode)) {
			why = "not a regular file";
		} else if (st.st_size == 0) {
			why = "empty";
		} else if ((uint64_t)st.st_size > SIZE_MAX) {
			why = "too large";
		} else {
			void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
			if (p == MAP_FAILED) {
				fmt_fixed(reason, sizeof(reason), "cannot be read: %s",
					  strerror(errno));
				why = reason;
			} else {
				int rc = load_image(s, p, (size_t)st.st_size, now, &why);
				munmap(p, (size_t)st.st_size);
				if (rc == 0)
					why = NULL;
			}
		}
		close(fd);
	}
	if (!why)
		return;
	size_t plen = strlen(path);
	char *aside = malloc(plen + sizeof(".corrupt"));
	if (aside) {
		memcpy(aside, path, plen);
		memcpy(aside + plen, ".corrupt", sizeof(".corrupt"));
	}
	if (aside && rename(path, aside) == 0)
		fmt_fixed(warn, warnlen,
			  "snapshot %.200s: %s; set aside as %.200s, limits start from zero",
			  path, why, aside);
	else
		fmt_fixed(warn, warnlen,
			  "snapshot %.200s: %s (and it could not be set aside: %s); limits start from zero",
			  path, why, aside ? strerror(errno) : "out of memory");
	free(aside);
}
