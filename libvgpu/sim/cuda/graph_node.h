/*
 * graph_node.h - the kinds of graph node and their parameters
 * (graph_node.c), for executables (graph_exec.c) and stream capture
 * (capture.c). Above graph.h and kernel.h.
 */
#ifndef VGPU_SIM_CUDA_GRAPH_NODE_H
#define VGPU_SIM_CUDA_GRAPH_NODE_H

#include "graph.h"

/* CUDA 12's generic node parameters (CUgraphNodeParams). */
struct node_params {
    int type;
    int reserved0[3];
    union {
        long long reserved1[29];
        CUDA_KERNEL_NODE_PARAMS_v2 kernel;
        struct {
            int flags, reserved;
            CUcontext ctx;
            unsigned char copy[MEMCPY3D_BYTES];
        } memcpy;
        struct {
            CUDA_MEMSET_NODE_PARAMS set;
            CUcontext ctx;
        } memset;
        CUDA_HOST_NODE_PARAMS host;
        CUgraph graph;
        CUevent event;
    } u;
    long long reserved2;
};

/* A kernel node's parameters from p, into n; its run time checked and set.
 * Kernel parameters are read now: the caller's arrays may go. */
CUresult cu_graph_kernel_params(struct CUgraphNode_st *n, const CUDA_KERNEL_NODE_PARAMS_v2 *p);
/* The CUDA 10 forms' shorter parameter struct (no kern, ctx), widened. */
CUDA_KERNEL_NODE_PARAMS_v2 cu_graph_params_v2(const CUDA_KERNEL_NODE_PARAMS *p);
/* A memset node's parameters are valid (an element of 1, 2 or 4 bytes). */
int cu_graph_memset_ok(const CUDA_MEMSET_NODE_PARAMS *p);
/* A node's parameters from p, into proto (its type already set). */
CUresult cu_graph_params_from(struct CUgraphNode_st *proto, const struct node_params *p);

#endif /* VGPU_SIM_CUDA_GRAPH_NODE_H */
