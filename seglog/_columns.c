/* seglog._columns: Record objects to Arrow column buffers in one pass (records_to_batch's fast path).
 *
 * gather(records, record_type, max_topic_bytes, max_record_bytes, min_ts, max_ts) walks a list
 * (or tuple) of exactly ``record_type`` instances once, reads their slots directly, checks what
 * records_to_batch checks, and returns the buffers of the topic, value, key and ts columns:
 *
 *   (topic_offsets, topic_data, value_offsets, value_data, key_offsets, key_data,
 *    key_validity, key_nulls, ts, ts_validity, ts_nulls)
 *
 * offsets are int32 little-endian (n + 1 of them), validity bitmaps are Arrow's (bit i set:
 * row i present; None when nothing is null). It returns None as soon as anything is not the
 * plain case -- another type, a subclass, headers, a datetime ts, an invalid topic or value, a
 * ts out of range, more than 2 GiB in a column -- and the Python path then does the whole
 * conversion again and raises the precise error (with the record's index), so errors are
 * exactly those of the Python code. ts range checks apply to the ts given; missing ones are
 * stamped (and checked) by the caller.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>

enum { F_TOPIC, F_VALUE, F_KEY, F_TS, F_HEADERS, F_COUNT };
static const char *const FIELD_NAMES[F_COUNT] = {"topic", "value", "key", "ts", "headers"};

/* The slot offsets of the record type last seen (a type is immortal enough: held here). */
static PyTypeObject *cached_type = NULL;
static Py_ssize_t slot_offset[F_COUNT];

static int load_slots(PyTypeObject *type) {
    if (type == cached_type) {
        return 0;
    }
    Py_ssize_t offsets[F_COUNT];
    for (int f = 0; f < F_COUNT; f++) {
        PyObject *descr = PyObject_GetAttrString((PyObject *)type, FIELD_NAMES[f]);
        if (descr == NULL) {
            return -1;
        }
        if (Py_TYPE(descr) != &PyMemberDescr_Type) {
            Py_DECREF(descr);
            PyErr_Format(PyExc_TypeError, "%s.%s is not a slot", type->tp_name, FIELD_NAMES[f]);
            return -1;
        }
        PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
        if (member->type != T_OBJECT_EX && member->type != T_OBJECT) {
            Py_DECREF(descr);
            PyErr_Format(PyExc_TypeError, "%s.%s is not an object slot", type->tp_name, FIELD_NAMES[f]);
            return -1;
        }
        offsets[f] = member->offset;
        Py_DECREF(descr);
    }
    Py_INCREF(type);
    Py_XDECREF(cached_type);
    cached_type = type;
    memcpy(slot_offset, offsets, sizeof offsets);
    return 0;
}

static inline PyObject *slot(PyObject *obj, int field) {
    return *(PyObject **)((char *)obj + slot_offset[field]);
}

typedef struct {
    const char *topic;
    Py_ssize_t topic_len;
    const char *value;
    Py_ssize_t value_len;
    const char *key; /* NULL: no key */
    Py_ssize_t key_len;
    int64_t ts;
    int has_ts;
} Row;

/* No wildcards or NUL in topic names (UTF-8 never has these bytes inside a character):
 * three memchr scans of the packed bytes of every topic (vectorised in libc). */
static int topics_clean(const char *from, size_t total) {
    return !memchr(from, '+', total) && !memchr(from, '#', total) && !memchr(from, '\0', total);
}

/* A bytes object of n + 1 int32 offsets and one of the concatenated data; 0 on success. */
static int pack_binary(Py_ssize_t n, const Row *rows, int field, PyObject **offsets_out, PyObject **data_out) {
    int64_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        total += field == F_TOPIC ? rows[i].topic_len : field == F_VALUE ? rows[i].value_len : rows[i].key_len;
    }
    if (total > INT32_MAX) {
        return 1; /* a large_binary column: the Python path */
    }
    PyObject *offsets = PyBytes_FromStringAndSize(NULL, (n + 1) * (Py_ssize_t)sizeof(int32_t));
    PyObject *data = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (offsets == NULL || data == NULL) {
        Py_XDECREF(offsets);
        Py_XDECREF(data);
        return -1;
    }
    int32_t *off = (int32_t *)PyBytes_AS_STRING(offsets);
    char *out = PyBytes_AS_STRING(data);
    int32_t at = 0;
    off[0] = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *src;
        Py_ssize_t len;
        if (field == F_TOPIC) {
            src = rows[i].topic;
            len = rows[i].topic_len;
        } else if (field == F_VALUE) {
            src = rows[i].value;
            len = rows[i].value_len;
        } else {
            src = rows[i].key;
            len = rows[i].key_len;
        }
        if (len) {
            memcpy(out + at, src, (size_t)len);
            at += (int32_t)len;
        }
        off[i + 1] = at;
    }
    *offsets_out = offsets;
    *data_out = data;
    return 0;
}

/* Arrow validity bitmap (LSB first) of rows where present(i); None when all are present. */
static PyObject *validity(Py_ssize_t n, const Row *rows, int field, Py_ssize_t *nulls_out) {
    Py_ssize_t nulls = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        nulls += field == F_KEY ? rows[i].key == NULL : !rows[i].has_ts;
    }
    *nulls_out = nulls;
    if (nulls == 0) {
        Py_RETURN_NONE;
    }
    PyObject *bits = PyBytes_FromStringAndSize(NULL, (n + 7) / 8);
    if (bits == NULL) {
        return NULL;
    }
    unsigned char *b = (unsigned char *)PyBytes_AS_STRING(bits);
    memset(b, 0, (size_t)((n + 7) / 8));
    for (Py_ssize_t i = 0; i < n; i++) {
        int present = field == F_KEY ? rows[i].key != NULL : rows[i].has_ts;
        if (present) {
            b[i >> 3] |= (unsigned char)(1u << (i & 7));
        }
    }
    return bits;
}

static PyObject *gather(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *records, *type_obj;
    Py_ssize_t max_topic_bytes, max_record_bytes;
    long long min_ts, max_ts;
    if (!PyArg_ParseTuple(args, "OO!nnLL", &records, &PyType_Type, &type_obj, &max_topic_bytes,
                          &max_record_bytes, &min_ts, &max_ts)) {
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)type_obj;
    if (load_slots(type) < 0) {
        return NULL;
    }
    PyObject *seq = PySequence_Fast(records, "records must be a sequence");
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    Row *rows = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(Row));
    if (rows == NULL) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    PyObject *result = NULL;
    PyObject *t_off = NULL, *t_data = NULL, *v_off = NULL, *v_data = NULL, *k_off = NULL, *k_data = NULL;
    PyObject *k_valid = NULL, *ts_buf = NULL, *ts_valid = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = items[i];
        if (Py_TYPE(r) != type) {
            goto plain_path;
        }
        PyObject *topic = slot(r, F_TOPIC), *value = slot(r, F_VALUE), *key = slot(r, F_KEY);
        PyObject *ts = slot(r, F_TS), *headers = slot(r, F_HEADERS);
        if (topic == NULL || value == NULL || key == NULL || ts == NULL || headers == NULL) {
            goto plain_path; /* an unset slot: the Python path says so */
        }
        if (headers != Py_None || !PyUnicode_CheckExact(topic) || !PyBytes_Check(value)) {
            goto plain_path;
        }
        Row *row = &rows[i];
        row->topic = PyUnicode_AsUTF8AndSize(topic, &row->topic_len);
        if (row->topic == NULL) {
            PyErr_Clear(); /* e.g. a lone surrogate: the Python path raises its error */
            goto plain_path;
        }
        if (row->topic_len == 0 || row->topic_len > max_topic_bytes) {
            goto plain_path; /* wildcards and NUL: one scan of all topics once packed, below */
        }
        row->value = PyBytes_AS_STRING(value);
        row->value_len = PyBytes_GET_SIZE(value);
        if (row->value_len > max_record_bytes) {
            goto plain_path;
        }
        if (key == Py_None) {
            row->key = NULL;
            row->key_len = 0;
        } else if (PyBytes_Check(key)) {
            row->key = PyBytes_AS_STRING(key);
            row->key_len = PyBytes_GET_SIZE(key);
        } else {
            goto plain_path;
        }
        if (ts == Py_None) {
            row->has_ts = 0;
            row->ts = 0;
        } else if (PyLong_CheckExact(ts)) {
            int overflow = 0;
            long long v = PyLong_AsLongLongAndOverflow(ts, &overflow);
            if (overflow || (v == -1 && PyErr_Occurred()) || v < min_ts || v > max_ts) {
                PyErr_Clear();
                goto plain_path;
            }
            row->has_ts = 1;
            row->ts = (int64_t)v;
        } else {
            goto plain_path;
        }
    }
    int status = pack_binary(n, rows, F_TOPIC, &t_off, &t_data);
    if (status == 0 && !topics_clean(PyBytes_AS_STRING(t_data), (size_t)PyBytes_GET_SIZE(t_data))) {
        status = 1;
    }
    if (status == 0) {
        status = pack_binary(n, rows, F_VALUE, &v_off, &v_data);
    }
    if (status == 0) {
        status = pack_binary(n, rows, F_KEY, &k_off, &k_data);
    }
    if (status < 0) {
        goto done;
    }
    if (status > 0) {
        goto plain_path;
    }
    Py_ssize_t key_nulls, ts_nulls;
    k_valid = validity(n, rows, F_KEY, &key_nulls);
    ts_valid = validity(n, rows, F_TS, &ts_nulls);
    ts_buf = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int64_t));
    if (k_valid == NULL || ts_valid == NULL || ts_buf == NULL) {
        goto done;
    }
    int64_t *tsv = (int64_t *)PyBytes_AS_STRING(ts_buf);
    for (Py_ssize_t i = 0; i < n; i++) {
        tsv[i] = rows[i].ts;
    }
    result = Py_BuildValue("(OOOOOOOnOOn)", t_off, t_data, v_off, v_data, k_off, k_data, k_valid, key_nulls,
                           ts_buf, ts_valid, ts_nulls);
    goto done;
plain_path:
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(t_off);
    Py_XDECREF(t_data);
    Py_XDECREF(v_off);
    Py_XDECREF(v_data);
    Py_XDECREF(k_off);
    Py_XDECREF(k_data);
    Py_XDECREF(k_valid);
    Py_XDECREF(ts_buf);
    Py_XDECREF(ts_valid);
    PyMem_Free(rows);
    Py_DECREF(seq);
    return result;
}

/* check_topics(offsets, data, n, max_topic_bytes) -> bool: table_to_batch's topic check over
 * Arrow buffers (int32 offsets already sliced to the array's n + 1 entries, the data buffer
 * they index; no nulls: the caller checked): every topic 1..max_topic_bytes long without
 * '+', '#' or NUL. False sends the caller to its NumPy check, which names the first bad row. */
static PyObject *check_topics(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer off, data;
    Py_ssize_t n, max_topic_bytes;
    if (!PyArg_ParseTuple(args, "y*y*nn", &off, &data, &n, &max_topic_bytes)) {
        return NULL;
    }
    const int32_t *o = off.buf;
    int ok = n >= 0 && off.len >= (n + 1) * (Py_ssize_t)sizeof(int32_t);
    if (ok && n > 0 && (o[0] < 0 || o[n] > data.len)) {
        ok = 0;
    }
    for (Py_ssize_t i = 0; ok && i < n; i++) {
        int32_t len = o[i + 1] - o[i];
        ok = len > 0 && len <= max_topic_bytes;
    }
    if (ok && n > 0) {
        ok = topics_clean((const char *)data.buf + o[0], (size_t)(o[n] - o[0]));
    }
    PyBuffer_Release(&off);
    PyBuffer_Release(&data);
    return PyBool_FromLong(ok);
}

/* ts_in_range(ts, n, min_ts, max_ts) -> bool: every one of n int64 values in [min_ts, max_ts]. */
static PyObject *ts_in_range(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer ts;
    Py_ssize_t n;
    long long lo, hi;
    if (!PyArg_ParseTuple(args, "y*nLL", &ts, &n, &lo, &hi)) {
        return NULL;
    }
    const int64_t *v = ts.buf;
    int ok = n >= 0 && ts.len >= n * (Py_ssize_t)sizeof(int64_t);
    for (Py_ssize_t i = 0; ok && i < n; i++) {
        ok = v[i] >= lo && v[i] <= hi;
    }
    PyBuffer_Release(&ts);
    return PyBool_FromLong(ok);
}

static PyMethodDef methods[] = {
    {"check_topics", check_topics, METH_VARARGS, "check_topics(offsets, data, n, max_topic_bytes) -> bool"},
    {"ts_in_range", ts_in_range, METH_VARARGS, "ts_in_range(ts, n, min_ts, max_ts) -> bool"},
    {"gather", gather, METH_VARARGS,
     "gather(records, record_type, max_topic_bytes, max_record_bytes, min_ts, max_ts) -> buffers or None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "seglog._columns", "Record objects to Arrow column buffers in one pass.", -1, methods,
};

PyMODINIT_FUNC PyInit__columns(void) { return PyModule_Create(&module); }
