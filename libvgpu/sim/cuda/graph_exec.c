/*
 * graph_exec.c - executable graphs: instantiate a graph, set an
 * executable's node parameters, enable and disable its nodes, update it from
 * a graph and launch it on a stream; and the device's graph memory.
 *
 * An executable holds the graph's nodes in a topological order (ties in the
 * order they were added), with child graphs laid out in place; a launch
 * queues them in that order (every stream of a process is one in-order
 * queue here, so dependencies hold).
 */
#include <stdlib.h>
#include <string.h>

#include "copy.h"
#include "exec.h"
#include "gate.h"
#include "graph.h"
#include "graph_node.h"
#include "init.h"
#include "stream.h"

struct CUgraphExec_st {
    uint32_t magic;
    size_t n;
    struct CUgraphNode_st *nodes; /* copies */
    unsigned long long flags;
    struct user_ref *users;
    size_t nusers;
};

/* The nodes of g in a topological order (ties in the order they were
 * added), child graphs laid out in place, appended to *out as copies;
 * CUDA_ERROR_INVALID_VALUE for a cycle. */
static CUresult flatten(CUgraph g, struct CUgraphNode_st **out, size_t *n, size_t *cap,
                        struct CUgraphNode_st *parent, int depth)
{
    if (depth > MAX_NESTING)
        return CUDA_ERROR_INVALID_VALUE;
    size_t count = g->n;
    size_t *pending = calloc(count ? count : 1, sizeof *pending);
    unsigned char *done = calloc(count ? count : 1, 1);
    CUresult rc = pending && done ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
    for (size_t i = 0; i < count && !rc; i++)
        pending[i] = g->nodes[i]->ndeps;
    for (size_t placed = 0; placed < count && !rc;) {
        size_t i = 0;
        while (i < count && (done[i] || pending[i]))
            i++;
        if (i == count) {
            rc = CUDA_ERROR_INVALID_VALUE; /* a cycle */
            break;
        }
        done[i] = 1;
        placed++;
        struct CUgraphNode_st *node = g->nodes[i];
        for (size_t k = 0; k < count; k++)
            for (size_t j = 0; j < g->nodes[k]->ndeps; j++)
                if (g->nodes[k]->deps[j] == node)
                    pending[k]--;
        if (node->type == NODE_GRAPH) {
            rc = flatten(node->child, out, n, cap, parent ? parent : node, depth + 1);
            continue;
        }
        if (*n == *cap) {
            size_t c = *cap ? 2 * *cap : 16;
            struct CUgraphNode_st *t = realloc(*out, c * sizeof *t);
            if (!t) {
                rc = CUDA_ERROR_OUT_OF_MEMORY;
                break;
            }
            *out = t;
            *cap = c;
        }
        struct CUgraphNode_st *copy = &(*out)[(*n)++];
        *copy = *node;
        copy->orig = node;
        copy->parent = parent;
        copy->deps = NULL; /* an exec runs its nodes in order */
        copy->ndeps = 0;
        copy->attrs = NULL;
    }
    free(pending);
    free(done);
    return rc;
}

VGPU_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *pe, CUgraph g,
                                                 unsigned long long flags)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!pe || !cu_obj_is(g, MAGIC_GRAPH))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphNode_st *nodes = NULL;
    size_t n = 0, cap = 0;
    CUresult rc = flatten(g, &nodes, &n, &cap, NULL, 0);
    struct CUgraphExec_st *e = rc ? NULL : cu_obj_new(sizeof *e, MAGIC_GEXEC);
    if (!e) {
        free(nodes);
        return rc ? rc : CUDA_ERROR_OUT_OF_MEMORY;
    }
    e->nodes = nodes;
    e->n = n;
    e->flags = flags;
    e->users = cu_graph_users_copy(g->users, g->nusers);
    e->nusers = e->users ? g->nusers : 0;
    *pe = e;
    return CUDA_SUCCESS;
}

/* CUDA 11 form: (exec, graph, error node, log buffer, its size). */
VGPU_EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec *pe, CUgraph g, CUgraphNode *err,
                                           char *log, size_t logsize)
{
    if (err)
        *err = NULL;
    if (log && logsize)
        log[0] = '\0';
    return cuGraphInstantiateWithFlags(pe, g, 0);
}

typedef struct {
    unsigned long long flags;
    CUstream hUploadStream;
    CUgraphNode hErrNode_out;
    int result_out;
} CUDA_GRAPH_INSTANTIATE_PARAMS;

VGPU_EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec *pe, CUgraph g,
                                                  CUDA_GRAPH_INSTANTIATE_PARAMS *p)
{
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = cuGraphInstantiateWithFlags(pe, g, p->flags);
    p->hErrNode_out = NULL;
    p->result_out = rc == CUDA_SUCCESS ? 0 : 1;
    return rc;
}
VGPU_ALIAS(cuGraphInstantiateWithParams, cuGraphInstantiateWithParams_ptsz)

VGPU_ALIAS(cuGraphInstantiate_v2, cuGraphInstantiate)

VGPU_EXPORT CUresult cuGraphExecDestroy(CUgraphExec e)
{
    if (!cu_obj_is(e, MAGIC_GEXEC))
        return CUDA_ERROR_INVALID_VALUE;
    free(e->nodes);
    cu_graph_users_release(e->users, e->nusers);
    free(e->users);
    cu_obj_del(e, sizeof *e);
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuGraphExecKernelNodeSetParams_v2(CUgraphExec e, CUgraphNode n,
                                                       const CUDA_KERNEL_NODE_PARAMS_v2 *p)
{
    if (!cu_obj_is(e, MAGIC_GEXEC) || !cu_obj_is(n, MAGIC_NODE))
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < e->n; i++) {
        if (e->nodes[i].orig == n) {
            struct CUgraphNode_st copy = e->nodes[i];
            CUresult rc = cu_graph_kernel_params(&copy, p);
            if (rc == CUDA_SUCCESS)
                e->nodes[i] = copy;
            return rc;
        }
    }
    return CUDA_ERROR_INVALID_VALUE;
}

VGPU_EXPORT CUresult cuGraphExecKernelNodeSetParams(CUgraphExec e, CUgraphNode n,
                                                    const CUDA_KERNEL_NODE_PARAMS *p)
{
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    CUDA_KERNEL_NODE_PARAMS_v2 v2 = cu_graph_params_v2(p);
    return cuGraphExecKernelNodeSetParams_v2(e, n, &v2);
}

VGPU_EXPORT CUresult cuGraphUpload(CUgraphExec e, CUstream h)
{
    RESOLVE_STREAM(h, ctx, s);
    return cu_obj_is(e, MAGIC_GEXEC) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
VGPU_ALIAS(cuGraphUpload, cuGraphUpload_ptsz)

VGPU_EXPORT CUresult cuGraphLaunch(CUgraphExec e, CUstream h)
{
    GATE_BRACKET; /* its copies and memsets touch device memory */
    RESOLVE_STREAM(h, ctx, s);
    CUresult rc = CUDA_SUCCESS;
    if (!cu_obj_is(e, MAGIC_GEXEC))
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < e->n && rc == CUDA_SUCCESS; i++) {
        struct CUgraphNode_st *n = &e->nodes[i];
        if (n->disabled)
            continue;
        switch (n->type) {
        case NODE_EVENT_RECORD:
            rc = cuEventRecord(n->event, h);
            break;
        case NODE_WAIT_EVENT:
            rc = cuStreamWaitEvent(h, n->event, 0);
            break;
        case NODE_KERNEL:
            exec_kernel(ctx, s, n->ns);
            break;
        case NODE_HOST:
            exec_host_fn(ctx, s, n->host.fn, n->host.userData);
            break;
        case NODE_MEMSET:
            rc = cu_memset2d(n->set.dst, n->set.pitch, n->set.value, n->set.elementSize,
                             n->set.width, n->set.height);
            break;
        case NODE_MEMCPY:
            rc = cu_copy3d(n->copy);
            break;
        }
    }
    return rc;
}
VGPU_ALIAS(cuGraphLaunch, cuGraphLaunch_ptsz)

/* ---- an executable's nodes: their parameters ---- */

/* An exec's copies of a graph node (a node of a child graph may appear once
 * per child graph node that holds it). */
static struct CUgraphNode_st *exec_copy(CUgraphExec e, CUgraphNode n, size_t from)
{
    if (!cu_obj_is(e, MAGIC_GEXEC) || !cu_obj_is(n, MAGIC_NODE))
        return NULL;
    for (size_t i = from; i < e->n; i++)
        if (e->nodes[i].orig == n || e->nodes[i].parent == n)
            return &e->nodes[i];
    return NULL;
}

VGPU_EXPORT CUresult cuGraphExecHostNodeSetParams(CUgraphExec e, CUgraphNode n,
                                                  const CUDA_HOST_NODE_PARAMS *p)
{
    struct CUgraphNode_st *c = exec_copy(e, n, 0);
    if (!c || c->type != NODE_HOST || !p || !p->fn)
        return CUDA_ERROR_INVALID_VALUE;
    c->host = *p;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuGraphExecMemsetNodeSetParams(CUgraphExec e, CUgraphNode n,
                                                    const CUDA_MEMSET_NODE_PARAMS *p,
                                                    CUcontext ctx)
{
    (void)ctx;
    struct CUgraphNode_st *c = exec_copy(e, n, 0);
    if (!c || c->type != NODE_MEMSET || !cu_graph_memset_ok(p))
        return CUDA_ERROR_INVALID_VALUE;
    c->set = *p;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuGraphExecMemcpyNodeSetParams(CUgraphExec e, CUgraphNode n, const void *p,
                                                    CUcontext ctx)
{
    (void)ctx;
    struct CUgraphNode_st *c = exec_copy(e, n, 0);
    if (!c || c->type != NODE_MEMCPY || !p)
        return CUDA_ERROR_INVALID_VALUE;
    memcpy(c->copy, p, MEMCPY3D_BYTES);
    return CUDA_SUCCESS;
}

static CUresult exec_event_set(CUgraphExec e, CUgraphNode n, CUevent ev, int type)
{
    struct CUgraphNode_st *c = exec_copy(e, n, 0);
    if (!c || c->type != type || !cu_obj_is(ev, MAGIC_EVENT))
        return CUDA_ERROR_INVALID_VALUE;
    c->event = ev;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuGraphExecEventRecordNodeSetEvent(CUgraphExec e, CUgraphNode n, CUevent ev)
{
    return exec_event_set(e, n, ev, NODE_EVENT_RECORD);
}

VGPU_EXPORT CUresult cuGraphExecEventWaitNodeSetEvent(CUgraphExec e, CUgraphNode n, CUevent ev)
{
    return exec_event_set(e, n, ev, NODE_WAIT_EVENT);
}

/* The nodes of one child graph node in an exec are replaced by those of
 * `child`, which must have the same shape (nodes of the same kinds). */
VGPU_EXPORT CUresult cuGraphExecChildGraphNodeSetParams(CUgraphExec e, CUgraphNode n,
                                                        CUgraph child)
{
    if (!cu_obj_is(e, MAGIC_GEXEC) || cu_graph_node_of(n, NODE_GRAPH) ||
        !cu_obj_is(child, MAGIC_GRAPH))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphNode_st *nodes = NULL;
    size_t count = 0, cap = 0;
    CUresult rc = flatten(child, &nodes, &count, &cap, n, 1);
    size_t k = 0;
    for (size_t i = 0; i < e->n && rc == CUDA_SUCCESS; i++) {
        if (e->nodes[i].parent != n)
            continue;
        if (k >= count || nodes[k].type != e->nodes[i].type)
            rc = CUDA_ERROR_INVALID_VALUE;
        k++;
    }
    if (rc == CUDA_SUCCESS && k != count)
        rc = CUDA_ERROR_INVALID_VALUE;
    k = 0;
    for (size_t i = 0; i < e->n && rc == CUDA_SUCCESS; i++) {
        if (e->nodes[i].parent != n)
            continue;
        struct CUgraphNode_st *orig = e->nodes[i].orig;
        e->nodes[i] = nodes[k++];
        e->nodes[i].orig = orig;
        e->nodes[i].parent = n;
    }
    free(nodes);
    return rc;
}

VGPU_EXPORT CUresult cuGraphExecNodeSetParams(CUgraphExec e, CUgraphNode n,
                                              struct node_params *p)
{
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    if (p->type == NODE_GRAPH)
        return cuGraphExecChildGraphNodeSetParams(e, n, p->u.graph);
    struct CUgraphNode_st *c = exec_copy(e, n, 0);
    if (!c || c->type != p->type)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphNode_st copy = *c;
    CUresult rc = cu_graph_params_from(&copy, p);
    if (rc == CUDA_SUCCESS)
        *c = copy;
    return rc;
}

/* ---- executables: enabling nodes, flags, updates ---- */

VGPU_EXPORT CUresult cuGraphNodeSetEnabled(CUgraphExec e, CUgraphNode n, unsigned int on)
{
    struct CUgraphNode_st *c = exec_copy(e, n, 0);
    if (!c || (c->type != NODE_KERNEL && c->type != NODE_MEMCPY && c->type != NODE_MEMSET))
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < e->n; i++)
        if (e->nodes[i].orig == n)
            e->nodes[i].disabled = !on;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuGraphNodeGetEnabled(CUgraphExec e, CUgraphNode n, unsigned int *on)
{
    struct CUgraphNode_st *c = exec_copy(e, n, 0);
    if (!c || !on || (c->type != NODE_KERNEL && c->type != NODE_MEMCPY && c->type != NODE_MEMSET))
        return CUDA_ERROR_INVALID_VALUE;
    *on = !c->disabled;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuGraphExecGetFlags(CUgraphExec e, cuuint64_t *flags)
{
    if (!cu_obj_is(e, MAGIC_GEXEC) || !flags)
        return CUDA_ERROR_INVALID_VALUE;
    *flags = e->flags;
    return CUDA_SUCCESS;
}

enum { UPDATE_SUCCESS = 0, UPDATE_TOPOLOGY_CHANGED = 2, UPDATE_NODE_TYPE_CHANGED = 3 };

typedef struct {
    int result;
    CUgraphNode errorNode;
    CUgraphNode errorFromNode;
} CUgraphExecUpdateResultInfo;

/* The executable takes the parameters of g's nodes, if g has the same
 * shape (as many nodes, of the same kinds, in the same order) as the graph
 * it was made from; CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE otherwise, the
 * executable unchanged. */
VGPU_EXPORT CUresult cuGraphExecUpdate_v2(CUgraphExec e, CUgraph g,
                                          CUgraphExecUpdateResultInfo *info)
{
    if (!cu_obj_is(e, MAGIC_GEXEC) || !cu_obj_is(g, MAGIC_GRAPH) || !info)
        return CUDA_ERROR_INVALID_VALUE;
    memset(info, 0, sizeof *info);
    struct CUgraphNode_st *nodes = NULL;
    size_t n = 0, cap = 0;
    CUresult rc = flatten(g, &nodes, &n, &cap, NULL, 0);
    if (rc) {
        free(nodes);
        return rc;
    }
    int result = n != e->n ? UPDATE_TOPOLOGY_CHANGED : UPDATE_SUCCESS;
    for (size_t i = 0; i < n && result == UPDATE_SUCCESS; i++) {
        if (nodes[i].type != e->nodes[i].type) {
            result = UPDATE_NODE_TYPE_CHANGED;
            info->errorNode = nodes[i].orig;
        }
    }
    info->result = result;
    if (result == UPDATE_SUCCESS) {
        for (size_t i = 0; i < n; i++) {
            struct CUgraphNode_st *orig = e->nodes[i].orig, *parent = e->nodes[i].parent;
            int disabled = e->nodes[i].disabled;
            e->nodes[i] = nodes[i];
            e->nodes[i].orig = orig;
            e->nodes[i].parent = parent;
            e->nodes[i].disabled = disabled;
        }
    }
    free(nodes);
    return result == UPDATE_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
}

VGPU_EXPORT CUresult cuGraphExecUpdate(CUgraphExec e, CUgraph g, CUgraphNode *err, int *result)
{
    CUgraphExecUpdateResultInfo info;
    CUresult rc = cuGraphExecUpdate_v2(e, g, &info);
    if (err)
        *err = info.errorNode;
    if (result)
        *result = info.result;
    return rc;
}

/* ---- graph memory ----
 * Graphs here hold no memory of their own (no memory alloc/free nodes), so
 * every attribute reads 0; the high watermarks reset to 0 (the only value
 * they may be set to). */

enum { GRAPH_MEM_USED = 0, GRAPH_MEM_USED_HIGH = 1, GRAPH_MEM_RESERVED = 2,
       GRAPH_MEM_RESERVED_HIGH = 3 };

VGPU_EXPORT CUresult cuDeviceGetGraphMemAttribute(CUdevice dev, int attr, void *value)
{
    CHECK_DEVICE(dev);
    if (!value || attr < GRAPH_MEM_USED || attr > GRAPH_MEM_RESERVED_HIGH)
        return CUDA_ERROR_INVALID_VALUE;
    *(cuuint64_t *)value = 0;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuDeviceSetGraphMemAttribute(CUdevice dev, int attr, void *value)
{
    CHECK_DEVICE(dev);
    if (!value || (attr != GRAPH_MEM_USED_HIGH && attr != GRAPH_MEM_RESERVED_HIGH) ||
        *(cuuint64_t *)value != 0)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuDeviceGraphMemTrim(CUdevice dev)
{
    return cu_check_device(dev);
}
