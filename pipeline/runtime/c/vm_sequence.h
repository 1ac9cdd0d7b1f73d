/* Sequences and optionals in the VM (included by vm.c; docs/vm.md, opcodes 40-47:
 * pipeline/vm/sequence_ins.py).
 *
 * A sequence is a register of kind OBJ_SEQ whose storage (borrowed == SEQ_STORAGE,
 * never pooled) holds `size` element objects, each a tensor in a storage of its own
 * (inserting copies the tensor, so no later kernel writing a planned buffer changes
 * it). Sequences are immutable: Insert, Erase and Split make new ones; the elements'
 * storages are shared by reference. An empty optional is a register of kind OBJ_NONE
 * (over a pooled 0-byte storage, as every register of a kind holds one); an optional
 * holding a value is that value.
 */

enum { SEQ_CONSTRUCT = 40, SEQ_INSERT, SEQ_AT, SEQ_LENGTH, SEQ_ERASE, SEQ_SPLIT, NONE_VALUE,
       HAS_VALUE };

static int check_sequence(const struct func *fn, const struct ins *in) {
    const int64_t *w = in->w;
    uint32_t n = in->n;
#define POS_OK(x) ((x) == -1 || reg_ok(fn, (x)))
    switch (in->op) {
    case SEQ_CONSTRUCT: return n >= 2 && reg_ok(fn, w[0]) && check_list(fn, in, 1, 1) &&
                               (uint64_t)w[1] == n - 2;
    case SEQ_INSERT:
        return n == 4 && reg_ok(fn, w[0]) && reg_ok(fn, w[1]) && reg_ok(fn, w[2]) && POS_OK(w[3]);
    case SEQ_AT: return n == 3 && reg_ok(fn, w[0]) && reg_ok(fn, w[1]) && reg_ok(fn, w[2]);
    case SEQ_LENGTH: case HAS_VALUE: return n == 2 && reg_ok(fn, w[0]) && reg_ok(fn, w[1]);
    case SEQ_ERASE: return n == 3 && reg_ok(fn, w[0]) && reg_ok(fn, w[1]) && POS_OK(w[2]);
    case SEQ_SPLIT:
        if (n < 5 || !reg_ok(fn, w[0]) || !reg_ok(fn, w[1]) || w[2] < 0 ||
            w[2] >= (int64_t)MAX_NDIM || (w[3] != 0 && w[3] != 1) || !check_list(fn, in, 4, 0) ||
            (uint64_t)w[4] != n - 5)
            return 0;
        for (uint32_t k = 5; k < n; k++)
            if (w[k] < 0 || (uint64_t)w[k] > PL_MAX_STORAGE) return 0;
        return 1;
    case NONE_VALUE: return n == 1 && reg_ok(fn, w[0]);
    }
#undef POS_OK
    return 0;
}

static struct obj *seq_items(const struct obj *o) { return (struct obj *)o->st->data; }
static size_t seq_length(const struct obj *o) { return o->st->size; }

/* dst = a new sequence of n elements, all empty (the caller fills them). */
static int seq_new(pl_executor *h, struct obj *dst, size_t n) {
    struct storage *s = calloc(1, sizeof *s);
    void *items = calloc(n + 1, sizeof(struct obj));
    if (!s || !items) {
        free(s), free(items);
        return fail(h, "out of memory");
    }
    *s = (struct storage){1, n, items, NULL, SEQ_STORAGE, 0};
    struct obj o = {OBJ_SEQ, 0, 0, s, NULL, 0, {0}};
    obj_clear(h, dst);
    *dst = o; /* takes the new reference */
    return 0;
}

/* storage_release of a sequence's storage: its elements go too. */
static void seq_free(pl_executor *h, struct storage *s) {
    struct obj *items = s->data;
    for (size_t k = 0; k < s->size; k++) obj_clear(h, &items[k]);
    free(items), free(s);
}

/* dst = a copy of tensor src in a storage of its own. */
static int copy_tensor(pl_executor *h, struct obj *dst, const struct obj *src) {
    if (src->kind != OBJ_TENSOR) return fail(h, "VM: a sequence element is not a tensor");
    struct obj t = *src;
    if (!(t.st = storage_new(h, src->nbytes))) return -1;
    t.data = t.st->data;
    memcpy(t.data, src->data, src->nbytes);
    obj_clear(h, dst);
    *dst = t; /* takes storage_new's reference */
    return 0;
}

/* The position in register r (an int64 or int32 scalar), negative counted from the end
 * (n + 1 positions when inserting), or `absent` when r is -1. */
static int position(pl_executor *h, const struct func *fn, int64_t r, size_t n, int insert,
                    int64_t absent, int64_t *at) {
    const struct obj *o = r == -1 ? NULL : &fn->regs[r];
    int64_t v = absent;
    if (o && o->kind == OBJ_TENSOR && o->dtype == 2 && o->nbytes == 4) {
        int32_t v32;
        memcpy(&v32, o->data, sizeof v32);
        v = v32;
    } else if (o && int64_of(h, o, &v)) {
        return -1;
    }
    int64_t len = (int64_t)n + insert;
    if (o && v < 0) v += (int64_t)n;
    if (v < 0 || v >= len)
        return fail(h, "VM: sequence position %lld out of range for length %zu", (long long)v, n);
    *at = v;
    return 0;
}

/* SplitToSequence: the parts of src along axis, sizes[k] long. */
static int seq_split(pl_executor *h, struct obj *dst, const struct obj *src, const int64_t *w) {
    int64_t axis = w[2], n = w[4];
    const int64_t *sizes = w + 5;
    if (src->kind != OBJ_TENSOR || axis >= src->ndim || !DTYPES[src->dtype].size)
        return fail(h, "VM: SplitToSequence of a tensor without that axis (or sub-byte)");
    size_t outer = 1, inner = DTYPES[src->dtype].size;
    for (int64_t d = 0; d < src->ndim; d++)
        if (d < axis) outer *= (size_t)src->shape[d];
        else if (d > axis) inner *= (size_t)src->shape[d];
    int64_t total = 0;
    for (int64_t k = 0; k < n; k++) total += sizes[k];
    if (total != src->shape[axis])
        return fail(h, "VM: SplitToSequence sizes add up to %lld, the axis is %lld",
                    (long long)total, (long long)src->shape[axis]);
    struct obj seq = {0};
    if (seq_new(h, &seq, (size_t)n)) return -1;
    int64_t start = 0;
    for (int64_t k = 0; k < n; k++) {
        struct obj t = *src;
        size_t part = (size_t)sizes[k] * inner;
        t.nbytes = outer * part;
        if (!(t.st = storage_new(h, t.nbytes))) return obj_clear(h, &seq), -1;
        t.data = t.st->data;
        for (size_t o = 0; o < outer; o++)
            memcpy((char *)t.data + o * part,
                   (const char *)src->data + (o * (size_t)src->shape[axis] + (size_t)start) *
                                                 inner, part);
        t.shape[axis] = sizes[k];
        if (!w[3]) { /* keepdims 0: the axis (of length 1) goes */
            memmove(t.shape + axis, t.shape + axis + 1,
                    (size_t)(t.ndim - axis - 1) * sizeof *t.shape);
            t.ndim--;
        }
        seq_items(&seq)[k] = t; /* takes storage_new's reference */
        start += sizes[k];
    }
    obj_set(h, dst, &seq);
    obj_clear(h, &seq);
    return 0;
}

static int sequence_op(pl_executor *h, struct func *fn, const struct ins *in) {
    struct obj *r = fn->regs, seq = {0};
    const int64_t *w = in->w;
    int64_t at = 0;
    if (in->op == SEQ_CONSTRUCT) {
        if (seq_new(h, &seq, (size_t)w[1])) return -1;
        for (int64_t k = 0; k < w[1]; k++)
            if (copy_tensor(h, &seq_items(&seq)[k], &r[w[2 + k]])) return obj_clear(h, &seq), -1;
    } else if (in->op == SEQ_SPLIT) {
        return seq_split(h, &r[w[0]], &r[w[1]], w);
    } else if (in->op == NONE_VALUE) { /* a register of a kind holds a storage: 0 bytes */
        struct obj none = {OBJ_NONE, 0, 0, storage_new(h, 0), NULL, 0, {0}};
        if (!none.st) return -1;
        none.data = none.st->data;
        obj_clear(h, &r[w[0]]);
        r[w[0]] = none; /* takes storage_new's reference */
        return 0;
    } else if (in->op == HAS_VALUE) {
        return new_scalar(h, &r[w[0]], DT_BOOL, r[w[1]].kind != OBJ_NONE);
    } else {
        const struct obj *src = &r[w[1]];
        if (src->kind != OBJ_SEQ) return fail(h, "VM: a sequence instruction on a non-sequence");
        size_t n = seq_length(src);
        const struct obj *items = seq_items(src);
        if (in->op == SEQ_LENGTH) return new_scalar(h, &r[w[0]], DT_INT64, (int64_t)n);
        if (in->op == SEQ_AT) {
            if (position(h, fn, w[2], n, 0, 0, &at)) return -1;
            obj_set(h, &r[w[0]], &items[at]);
            return 0;
        }
        int insert = in->op == SEQ_INSERT;
        if (position(h, fn, insert ? w[3] : w[2], n, insert, insert ? (int64_t)n : (int64_t)n - 1,
                     &at) ||
            seq_new(h, &seq, insert ? n + 1 : n - 1))
            return -1;
        struct obj *out = seq_items(&seq);
        for (size_t k = 0, j = 0; k < n; k++)
            if (insert || (int64_t)k != at) obj_set(h, &out[j++ + (insert && (int64_t)k >= at)],
                                                    &items[k]);
        if (insert && copy_tensor(h, &out[at], &r[w[2]])) return obj_clear(h, &seq), -1;
    }
    obj_set(h, &r[w[0]], &seq);
    obj_clear(h, &seq);
    return 0;
}

/* ---- the C API of sequence and optional outputs (pipeline_runtime.h) ---- */

/* Output i after a run: -1 a tensor, -2 an empty optional, else its sequence length. */
API int pl_output_count(const pl_executor *h, int i) {
    if (i < 0 || (uint32_t)i >= h->funcs[0].n_results || !h->ran) return -3;
    const struct obj *o = &h->outputs[i];
    return o->kind == OBJ_SEQ ? (int)seq_length(o) : o->kind == OBJ_NONE ? -2 : -1;
}

static const struct obj *output_item(pl_executor *h, int i, int j) {
    if (pl_output_count(h, i) <= j || j < 0) {
        fail(h, "output %d has no element %d", i, j);
        return NULL;
    }
    return &seq_items(&h->outputs[i])[j];
}

/* Element j of sequence output i: its dtype and shape. */
API int pl_output_item_info(pl_executor *h, int i, int j, pl_tensor_info *info) {
    const struct obj *o = output_item(h, i, j);
    if (!o) return -1;
    *info = (pl_tensor_info){h->funcs[0].results[i].name, DTYPES[o->dtype].name, o->ndim,
                             o->shape, o->nbytes};
    return 0;
}

API int pl_get_output_item(pl_executor *h, int i, int j, void *data, size_t nbytes) {
    const struct obj *o = output_item(h, i, j);
    if (!o) return -1;
    if (nbytes != o->nbytes)
        return fail(h, "output %d element %d: %zu bytes expected, given %zu", i, j, o->nbytes,
                    nbytes);
    memcpy(data, o->data, nbytes);
    return 0;
}
