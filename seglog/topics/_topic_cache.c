/* The stream stamper's (shard, topic bytes) -> stream cache in compiled code (issue 14).
 *
 * One open-addressing hash table (linear probing, at most half full) of 16-byte slots: the
 * key, the stream and where the entry sits in an arena owned by the table (its shard and
 * length, then the topic's bytes). Small slots keep the table in cache between appends: in
 * the append path encoding evicts it, and a 32-byte-slot table a quarter full (2 MiB for
 * 10,000 topics, against 512 KiB now) cost a cold lookup twice as much. A batch lookup reads
 * an Arrow string column's buffers in place (offsets + data, through the buffer protocol) and
 * writes stream ids and the rows that missed into caller-owned buffers: no Python object per
 * row.
 *
 * Exact: a hit compares the shard, the length and every byte of the topic. Keys are unique
 * in the table (a second (shard, topic) with a key already held stays uncached and is
 * learned on every stamp, as in the NumPy cache), so a lookup stops at the first slot with
 * its key. ``key_bits`` narrows keys to force collisions in tests.
 *
 * Thread safety: none of its own. The stamper calls it under its lock, with the GIL held
 * (a batch takes microseconds).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#define MIN_SLOTS 1024
#define MIN_ARENA 4096
#define MIX 0x9E3779B97F4A7C15ULL
#define AHEAD 16 /* rows between a prefetch of cached bytes and their compare */

#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(addr) __builtin_prefetch(addr)
#else
#define PREFETCH(addr) ((void)(addr))
#endif

typedef struct {
    uint64_t key;    /* 0: free */
    uint32_t at;     /* the entry's head in the arena (see head_of) */
    uint32_t stream;
} Slot; /* 16 bytes: four per cache line */

/* An arena entry: an 8-byte head (the topic's length << 32 | the shard as uint32), then the
 * topic's bytes. A hit compares the head as one word, then the bytes. */
#define HEAD_BYTES 8
#define MAX_ARENA_BYTES ((size_t)UINT32_MAX) /* Slot.at is 32 bits: past it, topics stay uncached */

static inline uint64_t head_of(size_t len, int64_t shard) { return ((uint64_t)len << 32) | (uint32_t)shard; }

typedef struct {
    PyObject_HEAD
    Slot *slots;
    size_t mask; /* slots - 1 (a power of two minus one) */
    size_t count;
    unsigned char *arena;
    size_t arena_len;
    size_t arena_cap;
    uint64_t key_mask;
} TopicCache;

static inline uint64_t fmix64(uint64_t h) {
    h ^= h >> 33;
    h *= 0xFF51AFD7ED558CCDULL;
    h ^= h >> 33;
    h *= 0xC4CEB9FE1A85EC53ULL;
    h ^= h >> 33;
    return h;
}

static inline uint64_t load8(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static inline uint64_t load4(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

#ifdef __SIZEOF_INT128__
/* The 128-bit product's halves xored (wyhash's "mum"): a full mix in one multiply. */
static inline uint64_t mum(uint64_t a, uint64_t b) {
    __uint128_t r = (__uint128_t)a * b;
    return (uint64_t)r ^ (uint64_t)(r >> 64);
}
#else
static inline uint64_t mum(uint64_t a, uint64_t b) { return fmix64(a * 0xBF58476D1CE4E5B9ULL ^ fmix64(b)); }
#endif

#define S1 0xA0761D6478BD642FULL
#define S2 0xE7037ED1A0B428DBULL

/* A row's cache key: wyhash's structure (fixed seeds), the shard mixed into the seed. Rows of
 * up to 16 bytes are two (overlapping) loads; longer ones 16 bytes per multiply. */
static inline uint64_t key_of(const TopicCache *self, const unsigned char *p, size_t n, int64_t shard) {
    uint64_t seed = ((uint64_t)shard * MIX) ^ S2;
    uint64_t a, b;
    if (n <= 16) {
        if (n >= 4) {
            size_t shift = (n >> 3) << 2;
            a = (load4(p) << 32) | load4(p + shift);
            b = (load4(p + n - 4) << 32) | load4(p + n - 4 - shift);
        } else if (n) {
            a = ((uint64_t)p[0] << 16) | ((uint64_t)p[n >> 1] << 8) | p[n - 1];
            b = 0;
        } else {
            a = b = 0;
        }
    } else {
        size_t i = n;
        while (i > 16) {
            seed = mum(load8(p) ^ S1, load8(p + 8) ^ seed);
            p += 16;
            i -= 16;
        }
        a = load8(p + i - 16);
        b = load8(p + i - 8);
    }
    uint64_t h = mum(S1 ^ (uint64_t)n, mum(a ^ S1, b ^ seed)) & self->key_mask;
    return h ? h : 1; /* 0 marks a free slot */
}

/* Whether n bytes are equal (short rows: word compares inline instead of a libc call). */
static inline int same_bytes(const unsigned char *x, const unsigned char *y, size_t n) {
    if (n >= 8) {
        size_t i = 0;
        for (; i + 8 < n; i += 8)
            if (load8(x + i) != load8(y + i)) return 0;
        return load8(x + n - 8) == load8(y + n - 8);
    }
    if (n >= 4) return load4(x) == load4(y) && load4(x + n - 4) == load4(y + n - 4);
    for (size_t i = 0; i < n; i++)
        if (x[i] != y[i]) return 0;
    return 1;
}

/* --- buffers --------------------------------------------------------------------------- */

/* A column's buffers: offsets (int32 or int64 little-endian words) and data. */
typedef struct {
    Py_buffer offsets;
    Py_buffer data;
    Py_ssize_t offset; /* the array's offset (rows) */
    Py_ssize_t length;
    int width; /* bytes per offset: 4 (string) or 8 (large_string) */
} Column;

static int column_open(Column *c, PyObject *offsets, PyObject *data, Py_ssize_t offset, Py_ssize_t length,
                       int width) {
    c->offsets.obj = NULL;
    c->data.obj = NULL;
    if (width != 4 && width != 8) {
        PyErr_Format(PyExc_ValueError, "offset width must be 4 or 8, not %d", width);
        return -1;
    }
    if (offset < 0 || length < 0) {
        PyErr_SetString(PyExc_ValueError, "negative offset or length");
        return -1;
    }
    if (PyObject_GetBuffer(offsets, &c->offsets, PyBUF_SIMPLE) < 0) return -1;
    if (PyObject_GetBuffer(data, &c->data, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&c->offsets);
        c->offsets.obj = NULL;
        return -1;
    }
    if (length && c->offsets.len < (offset + length + 1) * (Py_ssize_t)width) {
        PyErr_SetString(PyExc_ValueError, "offsets buffer shorter than the column");
        PyBuffer_Release(&c->offsets);
        PyBuffer_Release(&c->data);
        return -1;
    }
    c->offset = offset;
    c->length = length;
    c->width = width;
    return 0;
}

static void column_close(Column *c) {
    if (c->offsets.obj) PyBuffer_Release(&c->offsets);
    if (c->data.obj) PyBuffer_Release(&c->data);
}

/* Row ``i``'s bytes; -1 (with an exception) when its offsets lie outside the data. */
static inline int column_row(const Column *c, Py_ssize_t i, const unsigned char **p, size_t *n) {
    int64_t lo, hi;
    const char *base = (const char *)c->offsets.buf;
    if (c->width == 4) {
        int32_t a, b;
        memcpy(&a, base + 4 * (c->offset + i), 4);
        memcpy(&b, base + 4 * (c->offset + i + 1), 4);
        lo = a;
        hi = b;
    } else {
        memcpy(&lo, base + 8 * (c->offset + i), 8);
        memcpy(&hi, base + 8 * (c->offset + i + 1), 8);
    }
    if (lo < 0 || hi < lo || hi > (int64_t)c->data.len || hi - lo > (int64_t)UINT32_MAX) {
        PyErr_Format(PyExc_ValueError, "row %zd: offsets %lld..%lld outside the data", i, (long long)lo,
                     (long long)hi);
        return -1;
    }
    *p = (const unsigned char *)c->data.buf + lo;
    *n = (size_t)(hi - lo);
    return 0;
}

/* An integer buffer (any signed width) with at least ``count`` items. */
static int int_buffer(PyObject *obj, Py_buffer *view, Py_ssize_t count, int writable, const char *what) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) return -1;
    Py_ssize_t size = view->itemsize;
    if ((size != 1 && size != 2 && size != 4 && size != 8) || view->len / size < count) {
        PyErr_Format(PyExc_ValueError, "%s: need %zd integers, got a buffer of %zd bytes of item size %zd", what,
                     count, view->len, size);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static inline int64_t int_at(const Py_buffer *view, Py_ssize_t i) {
    switch (view->itemsize) {
        case 1:
            return ((const int8_t *)view->buf)[i];
        case 2:
            return ((const int16_t *)view->buf)[i];
        case 4:
            return ((const int32_t *)view->buf)[i];
        default:
            return ((const int64_t *)view->buf)[i];
    }
}

/* --- the table ------------------------------------------------------------------------- */

static int table_alloc(TopicCache *self, size_t slots) {
    Slot *fresh = PyMem_Calloc(slots, sizeof(Slot));
    if (!fresh) {
        PyErr_NoMemory();
        return -1;
    }
    PyMem_Free(self->slots);
    self->slots = fresh;
    self->mask = slots - 1;
    return 0;
}

/* Put a slot whose key is not in the table yet into its first free slot. */
static inline void table_place(Slot *slots, size_t mask, const Slot *s) {
    size_t i = (size_t)s->key & mask;
    while (slots[i].key) i = (i + 1) & mask;
    slots[i] = *s;
}

static int table_grow(TopicCache *self) {
    size_t old_size = self->mask + 1;
    size_t size = old_size * 2;
    Slot *fresh = PyMem_Calloc(size, sizeof(Slot));
    if (!fresh) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < old_size; i++)
        if (self->slots[i].key) table_place(fresh, size - 1, &self->slots[i]);
    PyMem_Free(self->slots);
    self->slots = fresh;
    self->mask = size - 1;
    return 0;
}

static int arena_reserve(TopicCache *self, size_t more) {
    if (self->arena && self->arena_len + more <= self->arena_cap) return 0;
    size_t cap = self->arena_cap ? self->arena_cap : MIN_ARENA;
    while (cap < self->arena_len + more) cap *= 2;
    unsigned char *fresh = PyMem_Realloc(self->arena, cap);
    if (!fresh) {
        PyErr_NoMemory();
        return -1;
    }
    self->arena = fresh;
    self->arena_cap = cap;
    return 0;
}

static int cache_reset(TopicCache *self) {
    if (table_alloc(self, MIN_SLOTS) < 0) return -1;
    if (!self->arena && arena_reserve(self, MIN_ARENA) < 0) return -1;
    self->count = 0;
    self->arena_len = 0;
    return 0;
}

/* A slot's shard, from its arena entry's head. */
static inline long long slot_shard(const TopicCache *self, const Slot *s) {
    return (long long)(int32_t)(uint32_t)load8(self->arena + s->at);
}

static int ready(const TopicCache *self) {
    if (self->slots) return 0;
    PyErr_SetString(PyExc_RuntimeError, "TopicCache.__init__ was not called");
    return -1;
}

/* --- the type -------------------------------------------------------------------------- */

static int TopicCache_init(TopicCache *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"key_bits", NULL};
    int key_bits = 64;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|$i", kwlist, &key_bits)) return -1;
    if (key_bits < 1 || key_bits > 64) {
        PyErr_Format(PyExc_ValueError, "key_bits must be in 1..64, not %d", key_bits);
        return -1;
    }
    self->key_mask = key_bits == 64 ? ~0ULL : ((1ULL << key_bits) - 1);
    return cache_reset(self);
}

static void TopicCache_dealloc(TopicCache *self) {
    PyMem_Free(self->slots);
    PyMem_Free(self->arena);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

PyDoc_STRVAR(lookup_doc,
             "lookup(offsets, data, offset, length, width, shards, streams, miss_rows, miss_keys, /) -> int\n\n"
             "Look up every row of a string column (its offsets and data buffers, the array's offset and\n"
             "length, offset width 4 or 8) with ``shards`` (an int, or an integer buffer per row). Writes\n"
             "each hit's stream into ``streams`` (uint32 per row; misses get 0), the misses' row numbers\n"
             "and keys into ``miss_rows`` and ``miss_keys`` (int64), and returns the number of misses.");

static PyObject *TopicCache_lookup(TopicCache *self, PyObject *args) {
    PyObject *offsets_obj, *data_obj, *shards_obj, *streams_obj, *rows_obj, *keys_obj;
    Py_ssize_t offset, length;
    int width;
    if (!PyArg_ParseTuple(args, "OOnniOOOO:lookup", &offsets_obj, &data_obj, &offset, &length, &width,
                          &shards_obj, &streams_obj, &rows_obj, &keys_obj))
        return NULL;
    if (ready(self) < 0) return NULL;
    Column col;
    if (column_open(&col, offsets_obj, data_obj, offset, length, width) < 0) return NULL;
    Py_buffer shards = {0}, streams = {0}, rows = {0}, keys = {0};
    int64_t one_shard = 0;
    int per_row = !PyLong_Check(shards_obj);
    Py_ssize_t misses = -1;
    if (per_row) {
        if (int_buffer(shards_obj, &shards, length, 0, "shards") < 0) goto done;
    } else {
        one_shard = PyLong_AsLongLong(shards_obj);
        if (one_shard == -1 && PyErr_Occurred()) goto done;
    }
    if (int_buffer(streams_obj, &streams, length, 1, "streams") < 0) goto done;
    if (streams.itemsize != 4) {
        PyErr_SetString(PyExc_ValueError, "streams must be a uint32 buffer");
        goto done;
    }
    if (int_buffer(rows_obj, &rows, length, 1, "miss_rows") < 0) goto done;
    if (int_buffer(keys_obj, &keys, length, 1, "miss_keys") < 0) goto done;
    if (rows.itemsize != 8 || keys.itemsize != 8) {
        PyErr_SetString(PyExc_ValueError, "miss_rows and miss_keys must be int64 buffers");
        goto done;
    }
    uint32_t *out = streams.buf;
    int64_t *miss_rows = rows.buf, *miss_keys = keys.buf;
    const Slot *slots = self->slots;
    const size_t mask = self->mask;
    /* Two passes, so that the table's cache misses overlap instead of queueing: the first
     * hashes every row and prefetches its home slot, the second prefetches the cached bytes
     * of the row AHEAD rows on and compares row i. In the append path the table and arena
     * are cold (evicted by encoding): one miss after another cost 4-5x the lookup itself. */
    uint64_t *row_keys = PyMem_Malloc(sizeof(uint64_t) * (size_t)(length ? length : 1));
    if (!row_keys) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < length; i++) {
        const unsigned char *p;
        size_t n;
        if (column_row(&col, i, &p, &n) < 0) {
            PyMem_Free(row_keys);
            goto done;
        }
        uint64_t key = key_of(self, p, n, per_row ? int_at(&shards, i) : one_shard);
        row_keys[i] = key;
        PREFETCH(&slots[(size_t)key & mask]);
    }
    Py_ssize_t m = 0;
    for (Py_ssize_t i = 0; i < length; i++) {
        if (i + AHEAD < length) {
            const Slot *ahead = &slots[(size_t)row_keys[i + AHEAD] & mask];
            if (ahead->key == row_keys[i + AHEAD]) PREFETCH(self->arena + ahead->at);
        }
        const unsigned char *p = NULL;
        size_t n = 0;
        column_row(&col, i, &p, &n); /* checked in the first pass */
        int64_t shard = per_row ? int_at(&shards, i) : one_shard;
        uint64_t key = row_keys[i];
        size_t at = (size_t)key & mask;
        int hit = 0;
        for (;;) {
            const Slot *s = &slots[at];
            if (s->key == key) {
                const unsigned char *entry = self->arena + s->at;
                hit = shard == (int32_t)shard && load8(entry) == head_of(n, shard) &&
                      same_bytes(entry + HEAD_BYTES, p, n);
                if (hit) out[i] = s->stream;
                break;
            }
            if (!s->key) break;
            at = (at + 1) & mask;
        }
        if (!hit) {
            out[i] = 0;
            miss_rows[m] = i;
            miss_keys[m] = (int64_t)key;
            m++;
        }
    }
    PyMem_Free(row_keys);
    misses = m;
done:
    column_close(&col);
    if (shards.obj) PyBuffer_Release(&shards);
    if (streams.obj) PyBuffer_Release(&streams);
    if (rows.obj) PyBuffer_Release(&rows);
    if (keys.obj) PyBuffer_Release(&keys);
    return misses < 0 ? NULL : PyLong_FromSsize_t(misses);
}

PyDoc_STRVAR(insert_doc,
             "insert(offsets, data, offset, length, width, rows, shards, streams, /) -> int\n\n"
             "Cache ``(shards[k], topic of rows[k]) -> streams[k]`` for each k (integer buffers of equal\n"
             "length). A key the table holds already is skipped: the same topic, or another one whose\n"
             "key collides (it stays uncached). Returns the number of entries added.");

static PyObject *TopicCache_insert(TopicCache *self, PyObject *args) {
    PyObject *offsets_obj, *data_obj, *rows_obj, *shards_obj, *streams_obj;
    Py_ssize_t offset, length;
    int width;
    if (!PyArg_ParseTuple(args, "OOnniOOO:insert", &offsets_obj, &data_obj, &offset, &length, &width, &rows_obj,
                          &shards_obj, &streams_obj))
        return NULL;
    if (ready(self) < 0) return NULL;
    Column col;
    if (column_open(&col, offsets_obj, data_obj, offset, length, width) < 0) return NULL;
    Py_buffer rows = {0}, shards = {0}, streams = {0};
    Py_ssize_t added = -1;
    if (int_buffer(rows_obj, &rows, 0, 0, "rows") < 0) goto done;
    Py_ssize_t count = rows.len / rows.itemsize;
    if (int_buffer(shards_obj, &shards, count, 0, "shards") < 0) goto done;
    if (int_buffer(streams_obj, &streams, count, 0, "streams") < 0) goto done;
    Py_ssize_t a = 0;
    for (Py_ssize_t k = 0; k < count; k++) {
        int64_t row = int_at(&rows, k);
        int64_t shard = int_at(&shards, k);
        int64_t stream = int_at(&streams, k);
        if (row < 0 || row >= length) {
            PyErr_Format(PyExc_IndexError, "row %lld outside the column of %zd rows", (long long)row, length);
            goto done;
        }
        if (shard < INT32_MIN || shard > INT32_MAX || stream < 0 || stream > UINT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "shard or stream out of range");
            goto done;
        }
        const unsigned char *p;
        size_t n;
        if (column_row(&col, (Py_ssize_t)row, &p, &n) < 0) goto done;
        /* At most half full: a hit's probe stays within a cache line or two. */
        if (2 * (self->count + 1) > self->mask + 1 && table_grow(self) < 0) goto done;
        uint64_t key = key_of(self, p, n, shard);
        size_t at = (size_t)key & self->mask;
        int held = 0;
        while (self->slots[at].key) {
            if (self->slots[at].key == key) {
                held = 1;
                break;
            }
            at = (at + 1) & self->mask;
        }
        if (held || self->arena_len + HEAD_BYTES + n > MAX_ARENA_BYTES) continue;
        if (arena_reserve(self, HEAD_BYTES + n) < 0) goto done;
        uint64_t head = head_of(n, shard);
        memcpy(self->arena + self->arena_len, &head, HEAD_BYTES);
        memcpy(self->arena + self->arena_len + HEAD_BYTES, p, n);
        Slot *s = &self->slots[at];
        s->key = key;
        s->at = (uint32_t)self->arena_len;
        s->stream = (uint32_t)stream;
        self->arena_len += HEAD_BYTES + n;
        self->count++;
        a++;
    }
    added = a;
done:
    column_close(&col);
    if (rows.obj) PyBuffer_Release(&rows);
    if (shards.obj) PyBuffer_Release(&shards);
    if (streams.obj) PyBuffer_Release(&streams);
    return added < 0 ? NULL : PyLong_FromSsize_t(added);
}

PyDoc_STRVAR(drop_doc,
             "drop(shard, first_stream, /) -> int\n\n"
             "Forget the entries of ``shard`` with a stream >= ``first_stream`` (a cut or reset of its\n"
             "trie); the table and arena are rebuilt from what is kept. Returns the number dropped.");

static PyObject *TopicCache_drop(TopicCache *self, PyObject *args) {
    long long shard, first;
    if (!PyArg_ParseTuple(args, "LL:drop", &shard, &first)) return NULL;
    if (ready(self) < 0) return NULL;
    size_t size = self->mask + 1;
    size_t doomed = 0;
    for (size_t i = 0; i < size; i++) {
        const Slot *s = &self->slots[i];
        if (s->key && slot_shard(self, s) == shard && (long long)s->stream >= first) doomed++;
    }
    if (!doomed) return PyLong_FromLong(0);
    /* Rebuild: linear probing has no deletion without moving the run behind a slot. */
    Slot *fresh = PyMem_Calloc(size, sizeof(Slot));
    unsigned char *arena = PyMem_Malloc(self->arena_cap ? self->arena_cap : 1);
    if (!fresh || !arena) {
        PyMem_Free(fresh);
        PyMem_Free(arena);
        return PyErr_NoMemory();
    }
    size_t used = 0;
    for (size_t i = 0; i < size; i++) {
        Slot s = self->slots[i];
        if (!s.key || (slot_shard(self, &s) == shard && (long long)s.stream >= first)) continue;
        size_t bytes = HEAD_BYTES + (size_t)(load8(self->arena + s.at) >> 32);
        memcpy(arena + used, self->arena + s.at, bytes);
        s.at = (uint32_t)used;
        used += bytes;
        table_place(fresh, size - 1, &s);
    }
    PyMem_Free(self->slots);
    PyMem_Free(self->arena);
    self->slots = fresh;
    self->arena = arena;
    self->arena_len = used;
    self->count -= doomed;
    return PyLong_FromSize_t(doomed);
}

static PyObject *TopicCache_clear(TopicCache *self, PyObject *Py_UNUSED(ignored)) {
    if (cache_reset(self) < 0) return NULL;
    Py_RETURN_NONE;
}

static Py_ssize_t TopicCache_len(TopicCache *self) { return (Py_ssize_t)self->count; }

static PyMethodDef TopicCache_methods[] = {
    {"lookup", (PyCFunction)TopicCache_lookup, METH_VARARGS, lookup_doc},
    {"insert", (PyCFunction)TopicCache_insert, METH_VARARGS, insert_doc},
    {"drop", (PyCFunction)TopicCache_drop, METH_VARARGS, drop_doc},
    {"clear", (PyCFunction)TopicCache_clear, METH_NOARGS, "clear() -> None\n\nForget every entry."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods TopicCache_as_sequence = {
    .sq_length = (lenfunc)TopicCache_len,
};

static PyTypeObject TopicCacheType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "seglog.topics._topic_cache.TopicCache",
    .tp_doc = PyDoc_STR("TopicCache(*, key_bits=64)\n\nThe (shard, topic bytes) -> stream cache (len: entries)."),
    .tp_basicsize = sizeof(TopicCache),
    .tp_itemsize = 0,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)TopicCache_init,
    .tp_dealloc = (destructor)TopicCache_dealloc,
    .tp_methods = TopicCache_methods,
    .tp_as_sequence = &TopicCache_as_sequence,
};

PyDoc_STRVAR(distinct_small_doc,
             "distinct_small(values, out, /) -> int\n\n"
             "The distinct items of ``values`` (a uint32 buffer), ascending, into ``out`` (a writable\n"
             "uint32 buffer): returns how many, or -1 as soon as there are more than ``out`` holds.\n"
             "A frame's stream tags: a frame of interleaved streams is told apart after a few rows.");

static PyObject *distinct_small(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *values_obj, *out_obj;
    if (!PyArg_ParseTuple(args, "OO:distinct_small", &values_obj, &out_obj)) return NULL;
    Py_buffer values = {0}, out = {0};
    Py_ssize_t result = -2;
    if (int_buffer(values_obj, &values, 0, 0, "values") < 0) goto done;
    if (int_buffer(out_obj, &out, 0, 1, "out") < 0) goto done;
    if (values.itemsize != 4 || out.itemsize != 4) {
        PyErr_SetString(PyExc_ValueError, "values and out must be uint32 buffers");
        goto done;
    }
    {
        const uint32_t *v = values.buf;
        uint32_t *set = out.buf;
        Py_ssize_t n = values.len / 4, cap = out.len / 4, count = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            uint32_t x = v[i];
            if (i && x == v[i - 1]) continue; /* runs of one stream are common */
            Py_ssize_t lo = 0, hi = count;    /* the first item >= x */
            while (lo < hi) {
                Py_ssize_t mid = (lo + hi) / 2;
                if (set[mid] < x)
                    lo = mid + 1;
                else
                    hi = mid;
            }
            if (lo < count && set[lo] == x) continue;
            if (count == cap) {
                count = -1;
                break;
            }
            memmove(set + lo + 1, set + lo, (size_t)(count - lo) * 4);
            set[lo] = x;
            count++;
        }
        result = count;
    }
done:
    if (values.obj) PyBuffer_Release(&values);
    if (out.obj) PyBuffer_Release(&out);
    return result == -2 ? NULL : PyLong_FromSsize_t(result);
}

static PyMethodDef module_methods[] = {
    {"distinct_small", distinct_small, METH_VARARGS, distinct_small_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef topic_cache_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "seglog.topics._topic_cache",
    .m_doc = "The stream stamper's (shard, topic) -> stream cache in C (see seglog.topics.streams).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__topic_cache(void) {
    if (PyType_Ready(&TopicCacheType) < 0) return NULL;
    PyObject *m = PyModule_Create(&topic_cache_module);
    if (!m) return NULL;
    Py_INCREF(&TopicCacheType);
    if (PyModule_AddObject(m, "TopicCache", (PyObject *)&TopicCacheType) < 0) {
        Py_DECREF(&TopicCacheType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
