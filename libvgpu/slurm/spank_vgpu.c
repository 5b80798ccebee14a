/*
 * spank_vgpu.so: the --vgpu-core, --vgpu-policy and --vgpu-priority options of
 * srun, sbatch and salloc, for jobs that vgpuctl fences (docs/slurm.md).
 *
 * Built at a site against its own spank.h (`vgpuctl slurm build-spank`: the
 * SPANK API has no stable ABI across Slurm releases) and listed in
 * plugstack.conf. It only checks the values where they are given (a bad one
 * stops the submission with one line) and hands them to the job's Prolog as
 * SPANK_VGPU_CORE, SPANK_VGPU_POLICY and SPANK_VGPU_PRIORITY; `vgpuctl slurm
 * prolog` passes them on to the daemon, which never gives a job more than its
 * shards' share, nor the class high to a user its configuration does not
 * name.
 * Jobs that don't use the options are untouched.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <slurm/spank.h>

SPANK_PLUGIN(vgpu, 1);

static int g_core;            /* 0: not given */
static char g_policy[8];      /* "": not given */
static char g_priority[8];    /* "": not given */

static int opt_core(int val, const char *optarg, int remote)
{
    char *end = NULL;
    long v;

    (void)val;
    (void)remote;
    v = optarg ? strtol(optarg, &end, 10) : 0;
    if (!optarg || end == optarg || *end != '\0' || v < 1 || v > 100) {
        slurm_error("--vgpu-core must be 1 to 100 (percent of the GPU), not '%s'",
                    optarg ? optarg : "");
        return -1;
    }
    g_core = (int)v;
    return 0;
}

static int opt_policy(int val, const char *optarg, int remote)
{
    (void)val;
    (void)remote;
    if (!optarg || (strcmp(optarg, "hard") != 0 && strcmp(optarg, "soft") != 0)) {
        slurm_error("--vgpu-policy must be hard or soft, not '%s'", optarg ? optarg : "");
        return -1;
    }
    snprintf(g_policy, sizeof g_policy, "%s", optarg);
    return 0;
}

static int opt_priority(int val, const char *optarg, int remote)
{
    (void)val;
    (void)remote;
    if (!optarg || (strcmp(optarg, "low") != 0 && strcmp(optarg, "normal") != 0 &&
                    strcmp(optarg, "high") != 0)) {
        slurm_error("--vgpu-priority must be low, normal or high, not '%s'",
                    optarg ? optarg : "");
        return -1;
    }
    snprintf(g_priority, sizeof g_priority, "%s", optarg);
    return 0;
}

static struct spank_option g_options[] = {
    {"vgpu-core", "PCT",
     "Compute share of the GPU, percent (1-100); at most the share of the job's shards.",
     1, 0, opt_core},
    {"vgpu-policy", "hard|soft",
     "hard: never above the share; soft: may borrow idle GPU time.", 1, 0, opt_policy},
    {"vgpu-priority", "low|normal|high",
     "Priority class: high (latency-sensitive; the node's configuration says who may), "
     "normal, low (best effort).", 1, 0, opt_priority},
    SPANK_OPTIONS_TABLE_END
};

int slurm_spank_init(spank_t sp, int ac, char **av)
{
    (void)ac;
    (void)av;
    for (struct spank_option *o = g_options; o->name; o++) {
        if (spank_option_register(sp, o) != ESPANK_SUCCESS) {
            slurm_error("vgpu: cannot register --%s", o->name);
            return -1;
        }
    }
    return 0;
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
    char buf[16];
    spank_context_t ctx = spank_context();

    (void)ac;
    (void)av;
    if (ctx != S_CTX_LOCAL && ctx != S_CTX_ALLOCATOR)
        return 0;
    /* For the job's Prolog (a step of an existing job changes nothing). */
    if (g_core) {
        snprintf(buf, sizeof buf, "%d", g_core);
        if (spank_job_control_setenv(sp, "VGPU_CORE", buf, 1) != ESPANK_SUCCESS)
            slurm_error("vgpu: cannot pass --vgpu-core to the job");
    }
    if (g_policy[0] &&
        spank_job_control_setenv(sp, "VGPU_POLICY", g_policy, 1) != ESPANK_SUCCESS)
        slurm_error("vgpu: cannot pass --vgpu-policy to the job");
    if (g_priority[0] &&
        spank_job_control_setenv(sp, "VGPU_PRIORITY", g_priority, 1) != ESPANK_SUCCESS)
        slurm_error("vgpu: cannot pass --vgpu-priority to the job");
    return 0;
}
