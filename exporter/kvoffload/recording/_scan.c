/* The strict reader's hot loop, compiled (optional: strict_reader reads a piece in Python when
 * this module was not built, to the same columns; tests run both and compare them).
 *
 * scan_series(buffer, start, end, wanted, unwanted) reads a piece of a family block of a
 * strict-layout recording (each series' points together) in place (the buffer is the mapped
 * file: nothing is copied) and returns, for each series in the order it first appears,
 * (head, times, values, ordered): its points' times and values as bytes of native doubles (for
 * array('d')), and whether the times are all finite and strictly increasing. Every line must
 * start with one of the `wanted` or `unwanted` prefixes and a wanted one be `head value stamp`
 * with exactly two blanks; anything else (a line of another family, other blanks, a value
 * float() refuses, no final newline) gives None, and the caller reads the piece in Python.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
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

/* float(token) as Python computes it, into *out: digits, signs, dots and exponents through
 * the routine float() uses (no float object made); anything else (inf, nan, underscores, other
 * whitespace) through float() itself. 0 when read; -1 (no exception) when float() refuses it;
 * -2 with an exception (no memory). */
static int parse_double(const char *at, Py_ssize_t len, double *out) {
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
        if ((x == -1.0 && PyErr_Occurred()) || stop != buf + len) {
            PyErr_Clear();
            return -1;
        }
        *out = x;
        return 0;
    }
    PyObject *text = PyBytes_FromStringAndSize(at, len);
    if (text == NULL)
        return -2;
    PyObject *value = PyFloat_FromString(text);
    Py_DECREF(text);
    if (value == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_ValueError))
            return -2;
        PyErr_Clear();
        return -1;
    }
    *out = PyFloat_AS_DOUBLE(value);
    Py_DECREF(value);
    return 0;
}

/* A piece of the buffer being read: its lines and the family's prefixes. */
typedef struct {
    Py_buffer view;
    spans_t wanted, unwanted;
    const char *p, *stop;
} piece_t;

/* Opens [start, end) of `buffer` with the family's prefixes; -1 with an exception (the piece
 * is closed then). */
static int piece_open(piece_t *piece, PyObject *buffer, Py_ssize_t start, Py_ssize_t end,
                      PyObject *wanted, PyObject *unwanted) {
    memset(piece, 0, sizeof(*piece));
    if (PyObject_GetBuffer(buffer, &piece->view, PyBUF_SIMPLE) < 0)
        return -1;
    if (start < 0 || end < start || end > piece->view.len) {
        PyErr_SetString(PyExc_ValueError, "range out of the buffer");
        goto fail;
    }
    if (prefixes_of(wanted, &piece->wanted) < 0 || prefixes_of(unwanted, &piece->unwanted) < 0)
        goto fail;
    piece->p = (const char *)piece->view.buf + start;
    piece->stop = (const char *)piece->view.buf + end;
    return 0;
fail:
    PyMem_Free(piece->wanted.items);
    PyMem_Free(piece->unwanted.items);
    PyBuffer_Release(&piece->view);
    return -1;
}

static void piece_close(piece_t *piece) {
    PyMem_Free(piece->wanted.items);
    PyMem_Free(piece->unwanted.items);
    PyBuffer_Release(&piece->view);
}

/* Whether the piece is one the scans read in bulk at all: lines ending in a newline. */
static int piece_whole(const piece_t *piece) {
    return piece->stop > piece->p && piece->stop[-1] == '\n';
}

/* The piece's next wanted line (of a whole piece), the lines of the family's other names
 * passed over: 1 one with exactly two blanks (*b1, *b2 at them; *line at its start, *eol at
 * its newline); 0 the end of the piece; -1 anything else — another family's line, a wanted
 * one with other than two blanks — which the scans hand back to the Python reading. */
static int next_wanted(piece_t *piece, const char **line, const char **eol, const char **b1,
                       const char **b2) {
    while (piece->p < piece->stop) {
        const char *p = piece->p;
        const char *end = memchr(p, '\n', (size_t)(piece->stop - p));
        Py_ssize_t len = end - p;
        piece->p = end + 1;
        if (!starts_with_any(p, len, &piece->wanted)) {
            if (starts_with_any(p, len, &piece->unwanted))
                continue;
            return -1;
        }
        *line = p;
        *eol = end;
        *b1 = memchr(p, ' ', (size_t)len);
        *b2 = *b1 ? memchr(*b1 + 1, ' ', (size_t)(end - *b1 - 1)) : NULL;
        if (*b2 == NULL || memchr(*b2 + 1, ' ', (size_t)(end - *b2 - 1)) != NULL)
            return -1;
        return 1;
    }
    return 0;
}

typedef struct {
    double *items;
    Py_ssize_t n, cap;
} doubles_t;

static int doubles_push(doubles_t *d, double x) {
    if (d->n == d->cap) {
        Py_ssize_t cap = d->cap ? 2 * d->cap : 64;
        double *grown = PyMem_Realloc(d->items, (size_t)cap * sizeof(double));
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        d->items = grown;
        d->cap = cap;
    }
    d->items[d->n++] = x;
    return 0;
}

typedef struct {
    const char *head;
    Py_ssize_t head_len;
    Py_uhash_t hash;
    doubles_t times, values;
    int ordered;
    Py_ssize_t next; /* the series whose line came after this one's last time (index + 1) */
    const char *value_at; /* its last value token, to read a repeated one (a _created) once */
    Py_ssize_t value_len;
} series_t;

typedef struct {
    series_t *items;
    Py_ssize_t n, cap;
    Py_ssize_t *slots; /* open addressing: index + 1 into items, 0 empty */
    Py_ssize_t nslots;
} table_t;

static Py_uhash_t hash_of(const char *at, Py_ssize_t len) {
    Py_uhash_t h = 14695981039346656037ULL;
    for (Py_ssize_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)at[i]) * 1099511628211ULL;
    return h;
}

static int table_grow(table_t *t) {
    Py_ssize_t nslots = t->nslots ? 2 * t->nslots : 64;
    Py_ssize_t *slots = PyMem_Calloc((size_t)nslots, sizeof(Py_ssize_t));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < t->n; i++) {
        Py_ssize_t at = (Py_ssize_t)(t->items[i].hash & (Py_uhash_t)(nslots - 1));
        while (slots[at])
            at = (at + 1) & (nslots - 1);
        slots[at] = i + 1;
    }
    PyMem_Free(t->slots);
    t->slots = slots;
    t->nslots = nslots;
    return 0;
}

/* The series of this head (added when new); NULL with an exception on no memory. */
static series_t *table_get(table_t *t, const char *head, Py_ssize_t len) {
    if (2 * (t->n + 1) > t->nslots && table_grow(t) < 0)
        return NULL;
    Py_uhash_t h = hash_of(head, len);
    Py_ssize_t at = (Py_ssize_t)(h & (Py_uhash_t)(t->nslots - 1));
    while (t->slots[at]) {
        series_t *s = &t->items[t->slots[at] - 1];
        if (s->hash == h && s->head_len == len && memcmp(s->head, head, (size_t)len) == 0)
            return s;
        at = (at + 1) & (t->nslots - 1);
    }
    if (t->n == t->cap) {
        Py_ssize_t cap = t->cap ? 2 * t->cap : 16;
        series_t *grown = PyMem_Realloc(t->items, (size_t)cap * sizeof(series_t));
        if (grown == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        t->items = grown;
        t->cap = cap;
    }
    series_t *s = &t->items[t->n];
    memset(s, 0, sizeof(*s));
    s->head = head;
    s->head_len = len;
    s->hash = h;
    s->ordered = 1;
    t->slots[at] = ++t->n;
    return s;
}

static void table_free(table_t *t) {
    for (Py_ssize_t i = 0; i < t->n; i++) {
        PyMem_Free(t->items[i].times.items);
        PyMem_Free(t->items[i].values.items);
    }
    PyMem_Free(t->items);
    PyMem_Free(t->slots);
}

static PyObject *scan_series(PyObject *module, PyObject *args) {
    PyObject *buffer, *wanted_tuple, *unwanted_tuple;
    Py_ssize_t start, end;
    if (!PyArg_ParseTuple(args, "OnnO!O!", &buffer, &start, &end, &PyTuple_Type, &wanted_tuple,
                          &PyTuple_Type, &unwanted_tuple))
        return NULL;
    piece_t piece;
    if (piece_open(&piece, buffer, start, end, wanted_tuple, unwanted_tuple) < 0)
        return NULL;
    PyObject *result = NULL;
    table_t table = {0};
    series_t *last = NULL;
    const char *last_stamp = NULL;
    Py_ssize_t last_stamp_len = -1;
    double last_t = 0.0;
    int bulk = piece_whole(&piece);
    const char *p, *eol, *b1 = NULL, *b2 = NULL;
    while (bulk && (bulk = next_wanted(&piece, &p, &eol, &b1, &b2)) > 0) {
        Py_ssize_t head_len = b1 - p;
        /* The series is most often the last one's again, or the one that came after it
         * last time (a counter's _total and _created take turns): checked before hashing. */
        series_t *s = last;
        if (s != NULL && !(s->head_len == head_len && memcmp(s->head, p, (size_t)head_len) == 0)) {
            s = s->next ? &table.items[s->next - 1] : NULL;
            if (s != NULL && !(s->head_len == head_len && memcmp(s->head, p, (size_t)head_len) == 0))
                s = NULL;
        }
        if (s == NULL) {
            Py_ssize_t last_index = last ? last - table.items : -1;
            s = table_get(&table, p, head_len); /* (may move the table: indices, not pointers) */
            if (s == NULL)
                goto done;
            if (last_index >= 0)
                table.items[last_index].next = (s - table.items) + 1;
        }
        double t, v;
        const char *stamp_at = b2 + 1, *value_at = b1 + 1;
        Py_ssize_t stamp_len = eol - stamp_at, value_len = b2 - value_at;
        int bad = 0;
        /* Series scraped together share their stamps: one read serves the lines after it. */
        if (stamp_len == last_stamp_len && memcmp(stamp_at, last_stamp, (size_t)stamp_len) == 0)
            t = last_t;
        else if ((bad = parse_double(stamp_at, stamp_len, &t)) == 0) {
            last_stamp = stamp_at;
            last_stamp_len = stamp_len;
            last_t = t;
        }
        if (bad == 0) {
            if (s->values.n && value_len == s->value_len &&
                memcmp(value_at, s->value_at, (size_t)value_len) == 0)
                v = s->values.items[s->values.n - 1];
            else
                bad = parse_double(value_at, value_len, &v);
        }
        if (bad == -2)
            goto done;
        if (bad) {
            bulk = -1;
            break;
        }
        s->value_at = value_at;
        s->value_len = value_len;
        if (!isfinite(t) || (s->times.n && !(t > s->times.items[s->times.n - 1])))
            s->ordered = 0;
        if (doubles_push(&s->times, t) < 0 || doubles_push(&s->values, v) < 0)
            goto done;
        last = s;
    }
    if (bulk < 0 || table.n == 0) { /* (0: the piece read to its end) */
        result = Py_NewRef(Py_None);
        goto done;
    }
    PyObject *out = PyList_New(table.n);
    if (out == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < table.n; i++) {
        series_t *s = &table.items[i];
        PyObject *item = Py_BuildValue(
            "(y#y#y#O)", s->head, s->head_len, (const char *)s->times.items,
            s->times.n * (Py_ssize_t)sizeof(double), (const char *)s->values.items,
            s->values.n * (Py_ssize_t)sizeof(double), s->ordered ? Py_True : Py_False);
        if (item == NULL) {
            Py_DECREF(out);
            goto done;
        }
        PyList_SET_ITEM(out, i, item);
    }
    result = out;

done:
    table_free(&table);
    piece_close(&piece);
    return result;
}

static PyMethodDef methods[] = {
    {"scan_series", scan_series, METH_VARARGS,
     "scan_series(buffer, start, end, wanted, unwanted) -> [(head, times, values, ordered)] "
     "or None: a piece of a strict recording's family block, series by series."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_scan",
    .m_doc = "The strict recording reader's hot loop, compiled.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__scan(void) { return PyModule_Create(&module); }
