/*
 * graph.h - graphs and their nodes (graph.c), for the other graph files:
 * graph_node.c (the kinds of node), graph_exec.c (executables) and
 * capture.c (stream capture). The structs behind graphs and nodes, adding
 * a node, and the user object references a graph holds. Above init.h.
 */
#ifndef VGPU_SIM_CUDA_GRAPH_H
#define VGPU_SIM_CUDA_GRAPH_H

#include <stddef.h>
#include <stdint.h>

#include "handle.h"

#define MAGIC_NODE 0x564e4f44u

enum { NODE_KERNEL = 0, NODE_MEMCPY = 1, NODE_MEMSET = 2, NODE_HOST = 3, NODE_GRAPH = 4,
       NODE_EMPTY = 5, NODE_WAIT_EVENT = 6, NODE_EVENT_RECORD = 7 };
#define KERNEL_ATTRS 16 /* kernel node attributes kept, by id (CUlaunchAttributeID) */
#define MAX_NESTING 16  /* child graphs within child graphs */

typedef struct {
    CUdeviceptr dst;
    size_t pitch;
    unsigned int value;
    unsigned int elementSize;
    size_t width;
    size_t height;
} CUDA_MEMSET_NODE_PARAMS;

typedef struct {
    void (*fn)(void *);
    void *userData;
} CUDA_HOST_NODE_PARAMS;

#define MEMCPY3D_BYTES 200 /* sizeof(CUDA_MEMCPY3D) on 64-bit */

struct CUgraphNode_st {
    uint32_t magic;
    int type;
    CUgraph graph;
    struct CUgraphNode_st *orig; /* in an exec: the graph's node it copies */
    struct CUgraphNode_st **deps; /* what it depends on (a graph's node only) */
    size_t ndeps;
    CUDA_KERNEL_NODE_PARAMS_v2 k;
    uint64_t ns;
    CUDA_MEMSET_NODE_PARAMS set;
    CUDA_HOST_NODE_PARAMS host;
    unsigned char copy[MEMCPY3D_BYTES];
    CUgraph child;        /* a child graph node's own copy of its graph */
    CUevent event;        /* an event record or wait node's event */
    int disabled;         /* in an exec: cuGraphNodeSetEnabled(0) */
    struct CUgraphNode_st *parent; /* in an exec: the child graph node it came from */
    unsigned char (*attrs)[64]; /* kernel node attributes (a graph's node only) */
};

struct user_ref {
    struct user_object *obj;
    unsigned int count;
};

struct CUgraph_st {
    uint32_t magic;
    size_t n, cap;
    struct CUgraphNode_st **nodes;
    struct user_ref *users;  /* user objects it holds references to */
    size_t nusers;
};

/* A node added to g, a copy of proto, depending on deps. */
CUresult cu_graph_add_node(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                           struct CUgraphNode_st *proto);
/* CUDA_SUCCESS if n is a node (of `type`, unless type < 0). */
CUresult cu_graph_node_of(CUgraphNode n, int type);

/* The user object references of a graph, copied (each retained) for a
 * clone or an executable; released when it goes. */
struct user_ref *cu_graph_users_copy(const struct user_ref *users, size_t n);
void cu_graph_users_release(struct user_ref *users, size_t n);

/* Entry points the other graph files build on. */
CUresult cuGraphCreate(CUgraph *pg, unsigned int flags);
CUresult cuGraphDestroy(CUgraph g);
CUresult cuGraphAddChildGraphNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps,
                                  size_t ndeps, CUgraph child);

#endif /* VGPU_SIM_CUDA_GRAPH_H */
