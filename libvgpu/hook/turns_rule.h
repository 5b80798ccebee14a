/*
 * turns_rule.h - the rule of turns (turns_rule.c): pure, no driver, no
 * clock, so that tests/c/turns_table.c drives it case by case.
 */
#ifndef VGPU_TURNS_RULE_H
#define VGPU_TURNS_RULE_H

#include <stdint.h>

#include "vgpu/region.h"

/* A device's schedule, as read from the job's limits. */
struct vgpu_schedule {
    uint64_t gen;
    uint64_t epoch_ns, cycle_ns;
    uint64_t start_ns, len_ns, credit_ns;
    uint64_t borrow_ns;
    uint32_t borrow, nopen;
    int prev;               /* a job's turn ends where this one begins: */
    int32_t prev_signal_id; /* ...its signal, its device there */
    uint32_t prev_dev;
    struct vgpu_span open[VGPU_MAX_OPEN];
};

#ifndef VGPU_TURN_STATE_DEFINED
#define VGPU_TURN_STATE_DEFINED
struct vgpu_turn_state {
    int64_t credit_ns;      /* GPU time it may still use in its turn */
    uint64_t k;             /* the turn it was last credited for */
    uint64_t gen;           /* the schedule's generation then */
    uint64_t late_ns;       /* this turn began this late, for the turn before */
    int began;              /* this turn's first launch went */
    int init;
};
#endif

enum { VGPU_TURN_GO_OWN = 1, VGPU_TURN_GO_BORROWED, VGPU_TURN_WAIT_HEAD, VGPU_TURN_NAP };

struct vgpu_verdict {
    int action;             /* VGPU_TURN_* */
    uint64_t nap_ns;        /* VGPU_TURN_NAP: until the next chance */
    uint64_t turn_end_ns;   /* when its turn ends, to tell the next turn's job:
                               the turn's end while in it (past it, a late turn
                               goes on only with work in flight, which its
                               signal tells), `now` once it has spent its
                               credit; 0: not in its turn */
};

/* Credit carried beyond a turn's: what is left when the next launch did not
 * fit, up to one launch (or this, if more). */
#define VGPU_TURN_CARRY_MIN_NS 1000000ull
/* The longest a turn waits for the work in flight of the turn before it
 * (and so begins, and ends, later): what that job may carry past its turn's
 * end, and no more, whatever it writes into its signal. */
#define VGPU_TURN_WAIT_MAX_NS 10000000ull
/* A turn that began late goes on as much past its end, up to this (as late
 * as a turn may begin): what a job gets is its credit, not what is left of
 * its span. It tells the next turn its span's end, not this: the job of the
 * next turn waits for its work in flight, not for launches it may not make
 * (docs/compute.md, "Limits"). */
#define VGPU_TURN_EXTEND_MAX_NS VGPU_TURN_WAIT_MAX_NS

/* Whether a launch may go now: the job's schedule, its turn state (updated:
 * credit at turn starts), the time, what it has in flight (n launches,
 * pending_ns of estimated GPU time, cost_ns one launch's), until when the
 * job of the turn before says its work runs or its turn lasts, whichever is
 * later (prev_busy_ns; 0: none), and
 * until when the job whose turn the open span at `now` follows says its
 * work runs (open_prev_busy_ns; 0: none; see vgpu_turn_open_at). */
struct vgpu_verdict vgpu_turn_decide(const struct vgpu_schedule *sc, struct vgpu_turn_state *ts,
                                     uint64_t now, uint32_t n, uint64_t cost_ns,
                                     uint64_t pending_ns, uint64_t prev_busy_ns,
                                     uint64_t open_prev_busy_ns);

/* The open span `now` is in, if the job may borrow (its index in sc->open),
 * else -1. */
int vgpu_turn_open_at(const struct vgpu_schedule *sc, uint64_t now);

#endif /* VGPU_TURNS_RULE_H */
