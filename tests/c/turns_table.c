/*
 * turns_table.c - the rule of turns (libvgpu/hook/turns_rule.c), case by
 * case: each row of the table is a schedule, a turn state, a time and what
 * is in flight, and what vgpu_turn_decide must answer (and leave in the
 * turn state). Built with turns_rule.c by tests/hook/test_turns_table.py.
 *
 * Prints one line a row: "ok NAME" or "FAIL NAME<tab>what differed", then
 * "rows N failed F"; the exit status is 1 when a row failed.
 *
 * Times are in the rows relative to the schedule's epoch (EPOCH, 1000 s of
 * CLOCK_MONOTONIC, so a row may look before it); turns are numbered as the
 * rule numbers them: k = floor((now - epoch - start % cycle) / cycle).
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "turns_rule.h"

#define MS 1000000LL
#define US 1000LL
#define EPOCH (1000000LL * MS)
#define NO_END UINT64_MAX          /* a nap with no end (nothing to wait for) */

/* The usual schedule: a cycle of 50 ms, the job's turn its first 15 ms
 * (30 %), its credit the turn's length. */
#define TURN_0_15 .cycle = 50 * MS, .start = 0, .len = 15 * MS, .credit = 15 * MS
/* A soft job of that turn, which may borrow the rest of the cycle with
 * 1 ms in flight. */
#define SOFT_0_15 TURN_0_15, .borrow = 1, .borrow_ns = 1 * MS, .nopen = 1, \
                  .open = {{15 * MS, 35 * MS}}

struct row {
    const char *name;
    /* the schedule */
    uint64_t gen, cycle, start, len, credit, borrow_ns;
    uint32_t borrow, nopen;
    int prev;                      /* a job's turn ends where this one begins */
    struct vgpu_span open[3];
    /* the turn state before (init is "fresh" inverted: 0 = initialised) */
    int fresh;
    int64_t credit_before;
    int64_t k_before;
    uint64_t gen_before;
    uint64_t late_before;
    int began_before;
    /* the call: now - EPOCH, what is in flight, and until when the job of
     * the turn before says its work runs (prev_busy_in from now; unset: 0,
     * none) */
    int64_t at;
    uint32_t n;
    uint64_t cost, pending;
    int prev_busy_set;
    int64_t prev_busy_in;
    /* until when the job before the open span says its work runs (as above) */
    int open_prev_busy_set;
    int64_t open_prev_busy_in;
    /* what it must answer */
    int action;
    uint64_t nap;                  /* checked for VGPU_TURN_NAP */
    int chk_credit;
    int64_t credit_after;
    int chk_k;
    int64_t k_after;
    int chk_late;
    uint64_t late_after;
    int chk_end;                   /* the turn end it tells (from EPOCH; -1: none) */
    int64_t end_at;
};

#define CREDIT(x) .chk_credit = 1, .credit_after = (x)
#define K(x) .chk_k = 1, .k_after = (x)
#define LATE(x) .chk_late = 1, .late_after = (x)
#define END(x) .chk_end = 1, .end_at = (x)
#define PREV_BUSY(x) .prev_busy_set = 1, .prev_busy_in = (x)
#define OPEN_PREV_BUSY(x) .open_prev_busy_set = 1, .open_prev_busy_in = (x)
/* A job whose turn, 0-15 ms, follows another's (prev). */
#define AFTER_PREV TURN_0_15, .prev = 1

static const struct row rows[] = {
    /* ---- in the turn ---- */
    {"in the turn with credit: go", TURN_0_15, .credit_before = 10 * MS, .at = 5 * MS,
     .n = 0, .cost = 1 * MS, .action = VGPU_TURN_GO_OWN, CREDIT(10 * MS), K(0)},
    {"in the turn, work in flight within the credit: go", TURN_0_15,
     .credit_before = 10 * MS, .at = 5 * MS, .n = 3, .cost = 1 * MS, .pending = 3 * MS,
     .action = VGPU_TURN_GO_OWN},
    {"in the turn, the launch uses the credit exactly: go", TURN_0_15,
     .credit_before = 4 * MS, .at = 5 * MS, .n = 3, .cost = 1 * MS, .pending = 3 * MS,
     .action = VGPU_TURN_GO_OWN},
    {"in the turn, credit spent with work in flight: wait for the head", TURN_0_15,
     .credit_before = 3 * MS, .at = 5 * MS, .n = 3, .cost = 1 * MS, .pending = 3 * MS,
     .action = VGPU_TURN_WAIT_HEAD},
    {"in the turn, in debt with work in flight: wait for the head", TURN_0_15,
     .credit_before = -2 * MS, .at = 5 * MS, .n = 1, .cost = 1 * MS, .pending = 1 * MS,
     .action = VGPU_TURN_WAIT_HEAD},
    {"in the turn, nothing in flight, half a launch's credit: go", TURN_0_15,
     .credit_before = 2500 * US, .at = 5 * MS, .n = 0, .cost = 5 * MS,
     .action = VGPU_TURN_GO_OWN, CREDIT(2500 * US)},
    {"in the turn, nothing in flight, under half a launch's credit: nap, it carries",
     TURN_0_15, .credit_before = 2400 * US, .at = 5 * MS, .n = 0, .cost = 5 * MS,
     .action = VGPU_TURN_NAP, .nap = 45 * MS, CREDIT(2400 * US)},
    {"a launch longer than the whole turn goes on any credit", TURN_0_15,
     .credit_before = 500 * US, .at = 5 * MS, .n = 0, .cost = 20 * MS,
     .action = VGPU_TURN_GO_OWN, CREDIT(500 * US)},
    {"in the turn, nothing in flight, no credit: nap to the next turn", TURN_0_15,
     .credit_before = 0, .at = 5 * MS, .n = 0, .cost = 1 * MS,
     .action = VGPU_TURN_NAP, .nap = 45 * MS},
    {"in the turn, nothing in flight, in debt: nap to the next turn", TURN_0_15,
     .credit_before = -3 * MS, .at = 10 * MS, .n = 0, .cost = 1 * MS,
     .action = VGPU_TURN_NAP, .nap = 40 * MS},
    {"a turn longer than the cycle is the whole cycle", .cycle = 50 * MS, .len = 80 * MS,
     .credit = 50 * MS, .credit_before = 10 * MS, .at = 45 * MS, .cost = 1 * MS,
     .action = VGPU_TURN_GO_OWN},

    /* ---- outside the turn (hard) ---- */
    {"after the turn: nap to the next turn's start", TURN_0_15, .credit_before = 10 * MS,
     .at = 20 * MS, .n = 0, .cost = 1 * MS, .action = VGPU_TURN_NAP, .nap = 30 * MS},
    {"at the turn's end exactly: nap a cycle less the turn", TURN_0_15,
     .credit_before = 10 * MS, .at = 15 * MS, .cost = 1 * MS,
     .action = VGPU_TURN_NAP, .nap = 35 * MS},
    {"before a later turn: nap to its start", .cycle = 50 * MS, .start = 15 * MS,
     .len = 30 * MS, .credit = 30 * MS, .credit_before = 10 * MS, .k_before = -1,
     .at = 5 * MS, .cost = 1 * MS, .action = VGPU_TURN_NAP, .nap = 10 * MS, K(-1)},
    {"a turn across the cycle's end: in it", .cycle = 50 * MS, .start = 40 * MS,
     .len = 20 * MS, .credit = 20 * MS, .credit_before = 5 * MS, .k_before = -1,
     .at = 5 * MS, .cost = 1 * MS, .action = VGPU_TURN_GO_OWN, K(-1)},
    {"a turn across the cycle's end: after it, nap to its start", .cycle = 50 * MS,
     .start = 40 * MS, .len = 20 * MS, .credit = 20 * MS, .credit_before = 5 * MS,
     .k_before = -1, .at = 20 * MS, .cost = 1 * MS, .action = VGPU_TURN_NAP,
     .nap = 20 * MS},
    {"a turn starting past the cycle's length starts at its remainder", .cycle = 50 * MS,
     .start = 115 * MS, .len = 10 * MS, .credit = 10 * MS, .credit_before = 5 * MS,
     .at = 17 * MS, .cost = 1 * MS, .action = VGPU_TURN_GO_OWN, K(0)},
    {"a hard job ignores the open spans", TURN_0_15, .nopen = 1,
     .open = {{15 * MS, 35 * MS}}, .borrow_ns = 1 * MS, .credit_before = 10 * MS,
     .at = 20 * MS, .cost = 1 * MS, .action = VGPU_TURN_NAP, .nap = 30 * MS},
    {"no turn and no borrowing: nap with no end", .cycle = 50 * MS, .credit_before = 0,
     .at = 20 * MS, .cost = 1 * MS, .action = VGPU_TURN_NAP, .nap = NO_END},

    /* ---- the turn's end, told to the job of the next turn ---- */
    {"in its turn it tells the turn's end", TURN_0_15, .credit_before = 10 * MS,
     .began_before = 1, .at = 5 * MS, .cost = 1 * MS, .action = VGPU_TURN_GO_OWN, END(15 * MS)},
    {"begun late, its turn goes on as much past its end (it tells the end)", TURN_0_15,
     .credit_before = 10 * MS, .late_before = 3 * MS, .began_before = 1, .at = 16 * MS,
     .n = 1, .cost = 1 * MS, .pending = 1 * MS, .action = VGPU_TURN_GO_OWN, END(15 * MS)},
    {"...while work of it is in flight: run dry past its end, it is over", TURN_0_15,
     .credit_before = 10 * MS, .late_before = 3 * MS, .began_before = 1, .at = 16 * MS,
     .n = 0, .cost = 1 * MS, .action = VGPU_TURN_NAP, .nap = 34 * MS, END(-1)},
    {"...and no further", TURN_0_15, .credit_before = 10 * MS, .late_before = 3 * MS,
     .began_before = 1, .at = 18 * MS, .n = 1, .cost = 1 * MS, .pending = 1 * MS,
     .action = VGPU_TURN_NAP, .nap = 32 * MS, END(-1)},
    {"...up to EXTEND_MAX past its end", TURN_0_15, .credit_before = 10 * MS,
     .late_before = 8 * MS, .began_before = 1, .at = 22 * MS, .n = 1, .cost = 1 * MS,
     .pending = 1 * MS, .action = VGPU_TURN_GO_OWN, END(15 * MS)},
    {"...past that it waits for its next turn", TURN_0_15,
     .credit_before = 10 * MS, .late_before = 8 * MS, .began_before = 1,
     .at = 15 * MS + (int64_t)VGPU_TURN_EXTEND_MAX_NS, .n = 1, .cost = 1 * MS,
     .pending = 1 * MS, .action = VGPU_TURN_NAP,
     .nap = 35 * MS - (int64_t)VGPU_TURN_EXTEND_MAX_NS, END(-1)},
    {"its credit spent, nothing in flight: its turn is over now", TURN_0_15,
     .credit_before = 0, .began_before = 1, .at = 10 * MS, .cost = 1 * MS,
     .action = VGPU_TURN_NAP, .nap = 40 * MS, END(10 * MS)},
    {"its credit spent, work in flight: its turn lasts", TURN_0_15,
     .credit_before = 500 * US, .began_before = 1, .at = 10 * MS, .n = 1, .cost = 1 * MS,
     .pending = 1 * MS, .action = VGPU_TURN_WAIT_HEAD, END(15 * MS)},
    {"waiting for the turn before: it tells its turn's end", AFTER_PREV,
     .credit_before = 15 * MS, .at = 1 * MS, .cost = 1 * MS, PREV_BUSY(2 * MS),
     .action = VGPU_TURN_NAP, .nap = 2 * MS, LATE(3 * MS), END(15 * MS)},

    /* ---- borrowing (soft) ---- */
    {"soft in an open span, nothing in flight: borrow (even a long launch)", SOFT_0_15,
     .credit_before = 10 * MS, .at = 20 * MS, .n = 0, .cost = 3 * MS,
     .action = VGPU_TURN_GO_BORROWED},
    {"soft in an open span, pending + cost below borrow_ns: borrow", SOFT_0_15,
     .credit_before = 10 * MS, .at = 20 * MS, .n = 1, .cost = 400 * US, .pending = 400 * US,
     .action = VGPU_TURN_GO_BORROWED},
    {"soft in an open span, pending + cost = borrow_ns: borrow", SOFT_0_15,
     .credit_before = 10 * MS, .at = 20 * MS, .n = 1, .cost = 500 * US, .pending = 500 * US,
     .action = VGPU_TURN_GO_BORROWED},
    {"soft in an open span, pending + cost over borrow_ns: wait for the head", SOFT_0_15,
     .credit_before = 10 * MS, .at = 20 * MS, .n = 2, .cost = 400 * US, .pending = 800 * US,
     .action = VGPU_TURN_WAIT_HEAD},
    {"soft in its turn with credit: its own, not borrowed", SOFT_0_15,
     .credit_before = 10 * MS, .at = 5 * MS, .n = 0, .cost = 1 * MS,
     .action = VGPU_TURN_GO_OWN},
    {"soft outside its turn and the open spans: nap to the open span", TURN_0_15,
     .borrow = 1, .borrow_ns = 1 * MS, .nopen = 1, .open = {{30 * MS, 20 * MS}},
     .credit_before = 10 * MS, .at = 20 * MS, .cost = 1 * MS, .action = VGPU_TURN_NAP,
     .nap = 10 * MS},
    {"soft outside its turn and the open spans: nap to its turn when nearer",
     .cycle = 50 * MS, .start = 25 * MS, .len = 10 * MS, .credit = 10 * MS, .borrow = 1,
     .borrow_ns = 1 * MS, .nopen = 2, .open = {{40 * MS, 10 * MS}, {0, 5 * MS}},
     .credit_before = 5 * MS, .k_before = -1, .at = 20 * MS, .cost = 1 * MS,
     .action = VGPU_TURN_NAP, .nap = 5 * MS},
    {"no turn, borrowing: nap to the open span", .cycle = 50 * MS, .borrow = 1,
     .borrow_ns = 1 * MS, .nopen = 1, .open = {{30 * MS, 20 * MS}}, .at = 10 * MS,
     .cost = 1 * MS, .action = VGPU_TURN_NAP, .nap = 20 * MS},
    {"no turn, borrowing, in the open span: borrow", .cycle = 50 * MS, .borrow = 1,
     .borrow_ns = 1 * MS, .nopen = 1, .open = {{30 * MS, 20 * MS}}, .at = 35 * MS,
     .cost = 1 * MS, .action = VGPU_TURN_GO_BORROWED},
    {"an open span across the cycle's end: in it", .cycle = 50 * MS, .borrow = 1,
     .borrow_ns = 1 * MS, .nopen = 1, .open = {{45 * MS, 10 * MS}}, .at = 2 * MS,
     .cost = 1 * MS, .action = VGPU_TURN_GO_BORROWED},
    {"a whole-cycle open span never ends: 16 ms queued at its 'end'", .cycle = 50 * MS,
     .borrow = 1, .borrow_ns = 50 * MS, .nopen = 1, .open = {{0, 50 * MS}}, .at = 48 * MS,
     .n = 16, .cost = 1 * MS, .pending = 16 * MS, .action = VGPU_TURN_GO_BORROWED},
    {"an open span to the cycle's end runs on into one beginning it", .cycle = 50 * MS,
     .borrow = 1, .borrow_ns = 10 * MS, .nopen = 2, .open = {{0, 5 * MS}, {40 * MS, 10 * MS}},
     .at = 48 * MS, .n = 4, .cost = 1 * MS, .pending = 4 * MS,
     .action = VGPU_TURN_GO_BORROWED},
    {"...but borrowed work must end in it", .cycle = 50 * MS, .borrow = 1,
     .borrow_ns = 10 * MS, .nopen = 2, .open = {{0, 5 * MS}, {40 * MS, 10 * MS}},
     .at = 48 * MS, .n = 7, .cost = 1 * MS, .pending = 7 * MS,
     .action = VGPU_TURN_WAIT_HEAD},
    {"the job before the open span still runs (past its turn): wait for it", SOFT_0_15,
     .credit_before = 0, .at = 16 * MS, .n = 0, .cost = 300 * US, OPEN_PREV_BUSY(2 * MS),
     .action = VGPU_TURN_NAP, .nap = 2 * MS},
    {"...its work done: borrow", SOFT_0_15, .credit_before = 0, .at = 16 * MS, .n = 0,
     .cost = 300 * US, OPEN_PREV_BUSY(-1 * MS), .action = VGPU_TURN_GO_BORROWED},
    {"...running past the open span's end: nap to the next chance (its own turn)",
     SOFT_0_15, .credit_before = 0, .at = 49 * MS, .n = 0, .cost = 300 * US,
     OPEN_PREV_BUSY(5 * MS), .action = VGPU_TURN_NAP, .nap = 1 * MS},
    {"...in its own turn it does not wait for the job before an open span", SOFT_0_15,
     .credit_before = 10 * MS, .at = 5 * MS, .n = 0, .cost = 1 * MS, OPEN_PREV_BUSY(5 * MS),
     .action = VGPU_TURN_GO_OWN},

    /* ---- credit: a turn's worth a turn begun, capped ---- */
    {"a turn begun: one turn's worth", TURN_0_15, .credit_before = 0, .k_before = -1,
     .at = 2 * MS, .cost = 1 * MS, .action = VGPU_TURN_GO_OWN, CREDIT(15 * MS), K(0)},
    {"credit comes at the turn's start, not the cycle's: not yet", .cycle = 50 * MS,
     .start = 15 * MS, .len = 15 * MS, .credit = 15 * MS, .credit_before = 0,
     .k_before = -1, .at = 10 * MS, .cost = 1 * MS, .action = VGPU_TURN_NAP,
     .nap = 5 * MS, CREDIT(0), K(-1)},
    {"credit comes at the turn's start, not the cycle's: now", .cycle = 50 * MS,
     .start = 15 * MS, .len = 15 * MS, .credit = 15 * MS, .credit_before = 0,
     .k_before = -1, .at = 16 * MS, .cost = 1 * MS, .action = VGPU_TURN_GO_OWN,
     CREDIT(15 * MS), K(0)},
    {"no credit twice in one turn", TURN_0_15, .credit_before = 2 * MS, .k_before = 0,
     .at = 10 * MS, .cost = 1 * MS, .action = VGPU_TURN_GO_OWN, CREDIT(2 * MS), K(0)},
    {"a turn begun and over unseen: its credit kept for the next", TURN_0_15,
     .credit_before = 0, .k_before = -1, .at = 20 * MS, .cost = 1 * MS,
     .action = VGPU_TURN_NAP, .nap = 30 * MS, CREDIT(15 * MS), K(0)},
    {"credit left over: capped at a turn and 1 ms", TURN_0_15, .credit_before = 5 * MS,
     .k_before = -1, .at = 2 * MS, .cost = 1 * MS, .action = VGPU_TURN_GO_OWN,
     CREDIT(16 * MS)},
    {"credit left over: capped at a turn and a launch longer than 1 ms", TURN_0_15,
     .credit_before = 5 * MS, .k_before = -1, .at = 2 * MS, .cost = 3 * MS,
     .action = VGPU_TURN_GO_OWN, CREDIT(18 * MS)},
    {"credit left over: a launch shorter than 1 ms carries 1 ms", TURN_0_15,
     .credit_before = 5 * MS, .k_before = -1, .at = 2 * MS, .cost = 200 * US,
     .action = VGPU_TURN_GO_OWN, CREDIT(16 * MS)},
    {"an idle job banks nothing: ten turns idle", TURN_0_15, .credit_before = 15 * MS,
     .k_before = -10, .at = 2 * MS, .cost = 1 * MS, .action = VGPU_TURN_GO_OWN,
     CREDIT(16 * MS), K(0)},
    {"an idle job banks nothing: 5000 turns idle", TURN_0_15, .credit_before = 0,
     .k_before = -5000, .at = 2 * MS, .cost = 1 * MS, .action = VGPU_TURN_GO_OWN,
     CREDIT(16 * MS), K(0)},
    {"a late wake over three turns pays a debt with all of them", TURN_0_15,
     .credit_before = -40 * MS, .k_before = -3, .at = 2 * MS, .n = 0, .cost = 1 * MS,
     .action = VGPU_TURN_GO_OWN, CREDIT(5 * MS), K(0)},
    {"one turn's worth does not pay a debt of two: nap", TURN_0_15,
     .credit_before = -25 * MS, .k_before = -1, .at = 2 * MS, .n = 0, .cost = 1 * MS,
     .action = VGPU_TURN_NAP, .nap = 48 * MS, CREDIT(-10 * MS)},
    {"a wake after 2000 turns pays a debt with all of them", TURN_0_15,
     .credit_before = -40 * MS, .k_before = -2000, .at = 2 * MS, .n = 0, .cost = 1 * MS,
     .action = VGPU_TURN_GO_OWN, CREDIT(16 * MS), K(0)},
    {"a 10 s kernel's debt, 2000 turns later: half of it paid", .cycle = 50 * MS,
     .len = 2500 * US, .credit = 2500 * US, .credit_before = -10000 * MS,
     .k_before = -2000, .at = 1 * MS, .n = 0, .cost = 1 * MS,
     .action = VGPU_TURN_NAP, .nap = 49 * MS, CREDIT(-5000 * MS)},

    /* ---- a new schedule, a first look ---- */
    {"a new schedule: credit rescaled to what is left of the turn", TURN_0_15, .gen = 4,
     .gen_before = 2, .credit_before = 15 * MS, .at = 5 * MS, .cost = 1 * MS,
     .action = VGPU_TURN_GO_OWN, CREDIT(10 * MS), K(0)},
    {"a new schedule keeps a debt", TURN_0_15, .gen = 4, .gen_before = 2,
     .credit_before = -3 * MS, .at = 5 * MS, .n = 0, .cost = 1 * MS,
     .action = VGPU_TURN_NAP, .nap = 45 * MS, CREDIT(-3 * MS)},
    {"a new schedule outside the turn: no credit till the next", TURN_0_15, .gen = 4,
     .gen_before = 2, .credit_before = 10 * MS, .at = 20 * MS, .cost = 1 * MS,
     .action = VGPU_TURN_NAP, .nap = 30 * MS, CREDIT(0)},
    {"a new schedule numbers the turns its own way", .cycle = 50 * MS, .start = 15 * MS,
     .len = 15 * MS, .credit = 15 * MS, .gen = 4, .gen_before = 2, .credit_before = 5 * MS,
     .k_before = 0, .at = 5 * MS, .cost = 1 * MS, .action = VGPU_TURN_NAP, .nap = 10 * MS,
     CREDIT(0), K(-1)},
    {"a new schedule: the next turn credits a turn's worth", .cycle = 50 * MS,
     .start = 15 * MS, .len = 15 * MS, .credit = 15 * MS, .gen = 4, .gen_before = 4,
     .credit_before = 0, .k_before = -1, .at = 16 * MS, .cost = 1 * MS,
     .action = VGPU_TURN_GO_OWN, CREDIT(15 * MS), K(0)},
    {"a new schedule after turns unseen: what is left of the turn", TURN_0_15, .gen = 4,
     .gen_before = 2, .credit_before = 0, .k_before = -10, .at = 2 * MS, .n = 0,
     .cost = 1 * MS, .action = VGPU_TURN_GO_OWN, CREDIT(13 * MS), K(0)},
    {"a first look in the turn: what is left of it", TURN_0_15, .fresh = 1,
     .credit_before = 99 * MS, .k_before = 77, .at = 12 * MS, .cost = 1 * MS,
     .action = VGPU_TURN_GO_OWN, CREDIT(3 * MS), K(0)},
    {"a first look outside the turn: none", TURN_0_15, .fresh = 1,
     .credit_before = 99 * MS, .at = 20 * MS, .cost = 1 * MS, .action = VGPU_TURN_NAP,
     .nap = 30 * MS, CREDIT(0), K(0)},

    /* ---- the turn before runs late ---- */
    {"the turn before still runs: wait for it", AFTER_PREV, .credit_before = 15 * MS,
     .at = 1 * MS, .n = 0, .cost = 1 * MS, PREV_BUSY(3 * MS), .action = VGPU_TURN_NAP,
     .nap = 3 * MS, LATE(4 * MS)},
    {"the turn before runs on: wait at most 10 ms into the turn", AFTER_PREV,
     .credit_before = 15 * MS, .at = 2 * MS, .n = 0, .cost = 1 * MS, PREV_BUSY(50 * MS),
     .action = VGPU_TURN_NAP, .nap = 8 * MS, LATE(10 * MS)},
    {"the turn before still runs 10 ms in: go", AFTER_PREV, .credit_before = 15 * MS,
     .late_before = 10 * MS, .at = 10 * MS, .n = 0, .cost = 1 * MS, PREV_BUSY(50 * MS),
     .action = VGPU_TURN_GO_OWN, LATE(10 * MS)},
    /* a turn begun 1 ms in (its thread woke then) ends 1 ms later */
    {"the turn before is done: go", AFTER_PREV, .credit_before = 15 * MS, .at = 1 * MS,
     .n = 0, .cost = 1 * MS, PREV_BUSY(-1 * MS), .action = VGPU_TURN_GO_OWN, LATE(1 * MS)},
    {"no signal from the turn before: go", AFTER_PREV, .credit_before = 15 * MS,
     .at = 1 * MS, .n = 0, .cost = 1 * MS, .action = VGPU_TURN_GO_OWN, LATE(1 * MS)},
    {"the first turn of the cycle waits for no one", TURN_0_15, .credit_before = 15 * MS,
     .at = 1 * MS, .n = 0, .cost = 1 * MS, PREV_BUSY(3 * MS), .action = VGPU_TURN_GO_OWN,
     LATE(1 * MS)},
    {"a thread woken 5 ms into its turn ends it 5 ms later", TURN_0_15,
     .credit_before = 15 * MS, .at = 5 * MS, .n = 0, .cost = 1 * MS,
     .action = VGPU_TURN_GO_OWN, LATE(5 * MS)},
    {"...and still launches 2 ms after the span's end, its work going on",
     TURN_0_15, .began_before = 1, .late_before = 5 * MS, .credit_before = 3 * MS,
     .at = 17 * MS, .n = 1, .cost = 1 * MS, .pending = 1 * MS,
     .action = VGPU_TURN_GO_OWN, LATE(5 * MS)},
    {"a thread woken after its span is over waits for the next turn", TURN_0_15,
     .credit_before = 15 * MS, .at = 16 * MS, .n = 0, .cost = 1 * MS,
     .action = VGPU_TURN_NAP, .nap = 34 * MS, LATE(0)},
    {"once the turn began, the turn before is not waited for", AFTER_PREV,
     .credit_before = 15 * MS, .began_before = 1, .at = 3 * MS, .n = 1, .cost = 1 * MS,
     .pending = 1 * MS, PREV_BUSY(3 * MS), .action = VGPU_TURN_GO_OWN},
    {"a turn that began late goes on as much later, its work going on", AFTER_PREV,
     .began_before = 1, .late_before = 4 * MS, .credit_before = 2 * MS, .at = 17 * MS,
     .n = 1, .cost = 1 * MS, .pending = 500 * US, .action = VGPU_TURN_GO_OWN,
     LATE(4 * MS)},
    {"a turn that began late: after its late end, nap to the next", AFTER_PREV,
     .began_before = 1, .late_before = 4 * MS, .credit_before = 2 * MS, .at = 20 * MS,
     .n = 0, .cost = 1 * MS, .action = VGPU_TURN_NAP, .nap = 30 * MS},
    {"a new turn is on time again", AFTER_PREV, .began_before = 1, .late_before = 4 * MS,
     .credit_before = 0, .k_before = -1, .at = 0, .n = 0, .cost = 1 * MS,
     .action = VGPU_TURN_GO_OWN, CREDIT(15 * MS), LATE(0), K(0)},

    /* ---- no schedule ---- */
    {"cycle 0: go, whatever the state", .cycle = 0, .len = 15 * MS, .credit = 15 * MS,
     .credit_before = -100 * MS, .at = 20 * MS, .n = 5, .cost = 1 * MS,
     .pending = 5 * MS, .action = VGPU_TURN_GO_OWN},
    {"cycle 0 on a first look: go", .cycle = 0, .fresh = 1, .at = -7 * MS,
     .action = VGPU_TURN_GO_OWN},

    /* ---- before the epoch: negative offsets ---- */
    {"before the epoch, in the turn: go", TURN_0_15, .credit_before = 10 * MS,
     .k_before = -1, .at = -45 * MS, .cost = 1 * MS, .action = VGPU_TURN_GO_OWN,
     CREDIT(10 * MS), K(-1)},
    {"before the epoch, after the turn: nap to the next", TURN_0_15,
     .credit_before = 10 * MS, .k_before = -1, .at = -20 * MS, .cost = 1 * MS,
     .action = VGPU_TURN_NAP, .nap = 20 * MS, K(-1)},
    {"before the epoch, a first look: what is left of the turn", TURN_0_15, .fresh = 1,
     .at = -40 * MS, .cost = 1 * MS, .action = VGPU_TURN_GO_OWN, CREDIT(5 * MS), K(-1)},
    {"before the epoch, a turn begun: credited", TURN_0_15, .credit_before = 0,
     .k_before = -2, .at = -49 * MS, .cost = 1 * MS, .action = VGPU_TURN_GO_OWN,
     CREDIT(15 * MS), K(-1)},
    {"across the epoch, a turn begun: credited", TURN_0_15, .credit_before = 0,
     .k_before = -1, .at = 1 * MS, .cost = 1 * MS, .action = VGPU_TURN_GO_OWN,
     CREDIT(15 * MS), K(0)},
    {"long before the epoch: the same cycle", TURN_0_15, .credit_before = 10 * MS,
     .k_before = -20000, .at = -1000000 * MS + 5 * MS, .cost = 1 * MS,
     .action = VGPU_TURN_GO_OWN, CREDIT(10 * MS), K(-20000)},
    {"before the epoch, a turn across the cycle's end", .cycle = 50 * MS, .start = 40 * MS,
     .len = 20 * MS, .credit = 20 * MS, .credit_before = 5 * MS, .k_before = -2,
     .at = -48 * MS, .cost = 1 * MS, .action = VGPU_TURN_GO_OWN, K(-2)},
};

static const char *action_name(int a)
{
    switch (a) {
    case VGPU_TURN_GO_OWN: return "GO_OWN";
    case VGPU_TURN_GO_BORROWED: return "GO_BORROWED";
    case VGPU_TURN_WAIT_HEAD: return "WAIT_HEAD";
    case VGPU_TURN_NAP: return "NAP";
    default: return "?";
    }
}

static int check(const struct row *r)
{
    struct vgpu_schedule sc;
    memset(&sc, 0, sizeof sc);
    sc.gen = r->gen;
    sc.epoch_ns = (uint64_t)EPOCH;
    sc.cycle_ns = r->cycle;
    sc.start_ns = r->start;
    sc.len_ns = r->len;
    sc.credit_ns = r->credit;
    sc.borrow_ns = r->borrow_ns;
    sc.borrow = r->borrow;
    sc.nopen = r->nopen;
    sc.prev = r->prev;
    for (uint32_t i = 0; i < r->nopen && i < 3; i++)
        sc.open[i] = r->open[i];
    struct vgpu_turn_state ts = {
        .credit_ns = r->credit_before,
        .k = (uint64_t)r->k_before,
        .gen = r->gen_before,
        .late_ns = r->late_before,
        .began = r->began_before,
        .init = !r->fresh,
    };
    uint64_t now = (uint64_t)(EPOCH + r->at);
    uint64_t prev_busy = r->prev_busy_set ? (uint64_t)((int64_t)now + r->prev_busy_in) : 0;
    uint64_t open_prev_busy =
        r->open_prev_busy_set ? (uint64_t)((int64_t)now + r->open_prev_busy_in) : 0;
    struct vgpu_verdict v = vgpu_turn_decide(&sc, &ts, now, r->n, r->cost, r->pending,
                                             prev_busy, open_prev_busy);

    char why[512] = "";
    size_t at = 0;
    if (v.action != r->action)
        at += (size_t)snprintf(why + at, sizeof why - at, " action %s, expected %s;",
                               action_name(v.action), action_name(r->action));
    if (r->action == VGPU_TURN_NAP && v.action == VGPU_TURN_NAP && v.nap_ns != r->nap)
        at += (size_t)snprintf(why + at, sizeof why - at,
                               " nap_ns %" PRIu64 ", expected %" PRIu64 ";", v.nap_ns, r->nap);
    if (r->chk_credit && ts.credit_ns != r->credit_after)
        at += (size_t)snprintf(why + at, sizeof why - at,
                               " credit_ns %" PRId64 ", expected %" PRId64 ";", ts.credit_ns,
                               r->credit_after);
    if (r->chk_k && (int64_t)ts.k != r->k_after)
        at += (size_t)snprintf(why + at, sizeof why - at,
                               " k %" PRId64 ", expected %" PRId64 ";", (int64_t)ts.k,
                               r->k_after);
    if (r->chk_late && ts.late_ns != r->late_after)
        at += (size_t)snprintf(why + at, sizeof why - at,
                               " late_ns %" PRIu64 ", expected %" PRIu64 ";", ts.late_ns,
                               r->late_after);
    if (r->cycle != 0 && (ts.gen != r->gen || !ts.init))
        at += (size_t)snprintf(why + at, sizeof why - at,
                               " state gen %" PRIu64 " init %d, expected gen %" PRIu64
                               " init 1;", ts.gen, ts.init, r->gen);
    uint64_t end_want = r->end_at < 0 ? 0 : (uint64_t)(EPOCH + r->end_at);
    if (r->chk_end && v.turn_end_ns != end_want)
        at += (size_t)snprintf(why + at, sizeof why - at,
                               " turn_end %" PRId64 ", expected %" PRId64 ";",
                               (int64_t)(v.turn_end_ns - (uint64_t)EPOCH), r->end_at);
    if (at > 0) {
        printf("FAIL %s\t%s\n", r->name, why);
        return 1;
    }
    printf("ok %s\n", r->name);
    return 0;
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    int n = (int)(sizeof rows / sizeof rows[0]), failed = 0;
    for (int i = 0; i < n; i++)
        failed += check(&rows[i]);
    /* vgpu_turn_open_at: the open span `now` is in, for a job that may borrow */
    struct vgpu_schedule sc = {.epoch_ns = (uint64_t)EPOCH, .cycle_ns = 50 * MS,
                               .borrow = 1, .nopen = 2,
                               .open = {{0, 5 * MS, 7, 0}, {40 * MS, 10 * MS, 8, 0}}};
    struct { int64_t at; int borrow; int want; const char *name; } spans[] = {
        {2 * MS, 1, 0, "open_at: in the span that begins the cycle"},
        {45 * MS, 1, 1, "open_at: in the span that ends it"},
        {10 * MS, 1, -1, "open_at: in none"},
        {50 * MS + 1 * MS, 1, 0, "open_at: a cycle later"},
        {45 * MS, 0, -1, "open_at: a job that may not borrow"},
    };
    for (size_t i = 0; i < sizeof spans / sizeof spans[0]; i++) {
        sc.borrow = (uint32_t)spans[i].borrow;
        int got = vgpu_turn_open_at(&sc, (uint64_t)(EPOCH + spans[i].at));
        n++;
        if (got != spans[i].want) {
            printf("FAIL %s\tgot %d, expected %d\n", spans[i].name, got, spans[i].want);
            failed++;
        } else {
            printf("ok %s\n", spans[i].name);
        }
    }
    printf("rows %d failed %d\n", n, failed);
    return failed ? 1 : 0;
}
