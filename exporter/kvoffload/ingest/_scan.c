/* The journal reader's hot loop, compiled (optional: fastjournal has the same function in
 * Python and uses it when this module was not built; tests run both and compare them).
 *
 * scan_block(buffer, start, end, wanted, unwanted, expected) reads one family block of a
 * scrape-ordered recording in place (the buffer is the mapped file: nothing is copied) and
 * returns what fastjournal's pure-Python `_scan_block` returns:
 *
 *   (values, stamp, heads)  every line starts with one of the `wanted` or `unwanted`
 *                           prefixes; the wanted lines are `head value stamp` with exactly two
 *                           blanks and one stamp for all; values are float(value) of each,
 *                           stamp the bytes; heads the list of heads, or None when they are
 *                           exactly `expected` (the heads of the family's previous block: a
 *                           target renders its series in a fixed order, so they usually are).
 *   None                    anything else (no wanted line, a line of another family, other
 *                           blanks, two stamps, a value float() refuses, no final newline):
 *                           the caller reads the block line by line, with its usual checks.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

typedef struct {
    const char *at;
    Py_ssize_t len;
} span_t;

typedef struct {
    span_t *items;
    Py_ssize_t n, cap;
} spans_t;

static int spans_push(spans_t *s, const char *at, Py_ssize_t len) {
    if (s->n == s->cap) {
        Py_ssize_t cap = s->cap ? 2 * s->cap : 256;
        span_t *grown = PyMem_Realloc(s->items, (size_t)cap * sizeof(span_t));
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        s->items = grown;
        s->cap = cap;
    }
    s->items[s->n].at = at;
    s->items[s->n].len = len;
    s->n++;
    return 0;
}

/* The prefixes of a tuple of bytes, as spans; -1 with an exception when an item is not bytes. */
static int prefixes_of(PyObject *tuple, spans_t *out) {
    Py_ssize_t n = PyTuple_GET_SIZE(tuple);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(tuple, i);
        if (!PyBytes_Check(item)) {
            PyErr_SetString(PyExc_TypeError, "prefixes must be bytes");
            return -1;
        }
        if (spans_push(out, PyBytes_AS_STRING(item), PyBytes_GET_SIZE(item)) < 0)
            return -1;
    }
    return 0;
}

static int starts_with_any(const char *line, Py_ssize_t len, const spans_t *prefixes) {
    for (Py_ssize_t i = 0; i < prefixes->n; i++) {
        const span_t *p = &prefixes->items[i];
        if (p->len <= len && memcmp(line, p->at, (size_t)p->len) == 0)
            return 1;
    }
    return 0;
}

/* float(token) as Python computes it: digits, signs, dots and exponents through the same
 * routine float() uses; anything else (inf, nan, underscores, other whitespace) through
 * float() itself. NULL without an exception when float() refuses it. */
static PyObject *to_float(const char *at, Py_ssize_t len) {
    char buf[64];
    int plain = len > 0 && len < (Py_ssize_t)sizeof(buf);
    for (Py_ssize_t i = 0; plain && i < len; i++) {
        char c = at[i];
        plain = (c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-';
    }
    if (plain) {
        memcpy(buf, at, (size_t)len);
        buf[len] = '\0';
        char *stop = NULL;
        double x = PyOS_string_to_double(buf, &stop, NULL);
        if (!(x == -1.0 && PyErr_Occurred()) && stop == buf + len)
            return PyFloat_FromDouble(x);
        PyErr_Clear();
        return NULL;
    }
    PyObject *text = PyBytes_FromStringAndSize(at, len);
    if (text == NULL)
        return NULL;
    PyObject *value = PyFloat_FromString(text);
    Py_DECREF(text);
    if (value == NULL && PyErr_ExceptionMatches(PyExc_ValueError))
        PyErr_Clear();
    return value;
}

static PyObject *scan_block(PyObject *module, PyObject *args) {
    PyObject *buffer, *wanted_tuple, *unwanted_tuple, *expected;
    Py_ssize_t start, end;
    if (!PyArg_ParseTuple(args, "OnnO!O!O", &buffer, &start, &end, &PyTuple_Type, &wanted_tuple,
                          &PyTuple_Type, &unwanted_tuple, &expected))
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(buffer, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *result = NULL;
    spans_t wanted = {0}, unwanted = {0}, heads = {0}, values = {0};
    if (start < 0 || end < start || end > view.len) {
        PyErr_SetString(PyExc_ValueError, "block out of the buffer");
        goto done;
    }
    if (prefixes_of(wanted_tuple, &wanted) < 0 || prefixes_of(unwanted_tuple, &unwanted) < 0)
        goto done;

    const char *base = (const char *)view.buf;
    const char *p = base + start, *stop = base + end;
    const char *stamp = NULL;
    Py_ssize_t stamp_len = 0;
    int bulk = end > start && stop[-1] == '\n';
    while (bulk && p < stop) {
        const char *eol = memchr(p, '\n', (size_t)(stop - p));
        Py_ssize_t len = eol - p;
        if (starts_with_any(p, len, &wanted)) {
            const char *b1 = memchr(p, ' ', (size_t)len);
            const char *b2 = b1 ? memchr(b1 + 1, ' ', (size_t)(eol - b1 - 1)) : NULL;
            if (b2 == NULL || memchr(b2 + 1, ' ', (size_t)(eol - b2 - 1)) != NULL) {
                bulk = 0;
                break;
            }
            if (stamp == NULL) {
                stamp = b2 + 1;
                stamp_len = eol - stamp;
            } else if (eol - b2 - 1 != stamp_len || memcmp(b2 + 1, stamp, (size_t)stamp_len) != 0) {
                bulk = 0;
                break;
            }
            if (spans_push(&heads, p, b1 - p) < 0 || spans_push(&values, b1 + 1, b2 - b1 - 1) < 0)
                goto done;
        } else if (!starts_with_any(p, len, &unwanted)) {
            bulk = 0;
            break;
        }
        p = eol + 1;
    }
    if (!bulk || heads.n == 0) {
        result = Py_NewRef(Py_None);
        goto done;
    }

    PyObject *floats = PyList_New(heads.n);
    if (floats == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < values.n; i++) {
        PyObject *x = to_float(values.items[i].at, values.items[i].len);
        if (x == NULL) {
            Py_DECREF(floats);
            if (!PyErr_Occurred())
                result = Py_NewRef(Py_None);
            goto done;
        }
        PyList_SET_ITEM(floats, i, x);
    }
    int same = PyList_Check(expected) && PyList_GET_SIZE(expected) == heads.n;
    for (Py_ssize_t i = 0; same && i < heads.n; i++) {
        PyObject *known = PyList_GET_ITEM(expected, i);
        same = PyBytes_Check(known) && PyBytes_GET_SIZE(known) == heads.items[i].len &&
               memcmp(PyBytes_AS_STRING(known), heads.items[i].at, (size_t)heads.items[i].len) == 0;
    }
    PyObject *head_list;
    if (same) {
        head_list = Py_NewRef(Py_None);
    } else {
        head_list = PyList_New(heads.n);
        for (Py_ssize_t i = 0; head_list != NULL && i < heads.n; i++) {
            PyObject *h = PyBytes_FromStringAndSize(heads.items[i].at, heads.items[i].len);
            if (h == NULL)
                Py_CLEAR(head_list);
            else
                PyList_SET_ITEM(head_list, i, h);
        }
    }
    PyObject *stamp_bytes = head_list ? PyBytes_FromStringAndSize(stamp, stamp_len) : NULL;
    if (stamp_bytes == NULL) {
        Py_DECREF(floats);
        Py_XDECREF(head_list);
        goto done;
    }
    result = PyTuple_Pack(3, floats, stamp_bytes, head_list);
    Py_DECREF(floats);
    Py_DECREF(stamp_bytes);
    Py_DECREF(head_list);

done:
    PyMem_Free(wanted.items);
    PyMem_Free(unwanted.items);
    PyMem_Free(heads.items);
    PyMem_Free(values.items);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"scan_block", scan_block, METH_VARARGS,
     "scan_block(buffer, start, end, wanted, unwanted, expected) -> (values, stamp, heads) "
     "or None: one family block of a journal, as fastjournal._scan_block reads it."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_scan", "The journal reader's hot loop, compiled.", -1, methods,
};

PyMODINIT_FUNC PyInit__scan(void) { return PyModule_Create(&module); }
