/*
 * turns_rule.c - the rule of turns (see turns.c for what it is for).
 * Pure: what it needs is handed in, what it changes is the turn state.
 */
#include "turns_rule.h"

/* floor(a / b) for a signed a and b > 0 */
static int64_t floor_div(int64_t a, int64_t b)
{
    int64_t q = a / b;
    return (a % b != 0 && a < 0) ? q - 1 : q;
}

/* Where `now` is in the cycle: 0 <= pos < cycle. */
static uint64_t position(const struct vgpu_schedule *sc, uint64_t now)
{
    int64_t t = (int64_t)(now - sc->epoch_ns);
    int64_t c = (int64_t)sc->cycle_ns;
    return (uint64_t)(t - floor_div(t, c) * c);
}

/* Time from pos until the span [start, start+len) of the cycle next begins
 * (0 when pos is in it). */
static uint64_t until_span(uint64_t pos, uint64_t start, uint64_t len, uint64_t cycle)
{
    uint64_t into = (pos + cycle - start % cycle) % cycle;
    if (into < len)
        return 0;
    return cycle - into;
}

/* What is left of the open span pos is in (0: in none), with the span it
 * runs on into across the cycle's end (a span that is the whole cycle never
 * ends). */
static uint64_t left_open(const struct vgpu_schedule *sc, uint64_t pos)
{
    uint64_t cycle = sc->cycle_ns, best = 0;
    uint32_t n = sc->nopen < VGPU_MAX_OPEN ? sc->nopen : VGPU_MAX_OPEN;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t start = sc->open[i].start_ns % cycle, len = sc->open[i].len_ns;
        uint64_t into = (pos + cycle - start) % cycle;
        if (into >= len)
            continue;
        if (len >= cycle)
            return UINT64_MAX / 4;
        uint64_t left = len - into;
        if (start + len >= cycle)       /* on into a span that begins the cycle */
            for (uint32_t j = 0; j < n; j++)
                if (j != i && sc->open[j].start_ns % cycle == 0)
                    left += sc->open[j].len_ns;
        if (left > best)
            best = left;
    }
    return best;
}

static uint64_t until_open(const struct vgpu_schedule *sc, uint64_t pos)
{
    uint64_t best = UINT64_MAX;
    for (uint32_t i = 0; i < sc->nopen && i < VGPU_MAX_OPEN; i++) {
        if (sc->open[i].len_ns == 0)
            continue;
        uint64_t u = until_span(pos, sc->open[i].start_ns, sc->open[i].len_ns, sc->cycle_ns);
        if (u < best)
            best = u;
    }
    return best;
}

int vgpu_turn_open_at(const struct vgpu_schedule *sc, uint64_t now)
{
    if (!sc->borrow || sc->cycle_ns == 0)
        return -1;
    uint64_t pos = position(sc, now);
    for (uint32_t i = 0; i < sc->nopen && i < VGPU_MAX_OPEN; i++)
        if (sc->open[i].len_ns > 0 &&
            until_span(pos, sc->open[i].start_ns, sc->open[i].len_ns, sc->cycle_ns) == 0)
            return (int)i;
    return -1;
}

struct vgpu_verdict vgpu_turn_decide(const struct vgpu_schedule *sc, struct vgpu_turn_state *ts,
                                     uint64_t now, uint32_t n, uint64_t cost_ns,
                                     uint64_t pending_ns, uint64_t prev_busy_ns,
                                     uint64_t open_prev_busy_ns)
{
    struct vgpu_verdict go_own = {VGPU_TURN_GO_OWN, 0, 0};
    if (sc->cycle_ns == 0)
        return go_own;          /* no schedule: nothing to keep to */
    uint64_t cycle = sc->cycle_ns;
    uint64_t len = sc->len_ns < cycle ? sc->len_ns : cycle;
    uint64_t pos = position(sc, now);

    /* the turn: k counts the turns begun by now */
    int64_t t = (int64_t)(now - sc->epoch_ns) - (int64_t)(sc->start_ns % cycle);
    int64_t k = floor_div(t, (int64_t)cycle);
    uint64_t into = (uint64_t)(t - k * (int64_t)cycle);
    uint64_t carry = cost_ns > VGPU_TURN_CARRY_MIN_NS ? cost_ns : VGPU_TURN_CARRY_MIN_NS;
    int64_t cap = (int64_t)(sc->credit_ns + carry);

    if (ts->init && k > (int64_t)ts->k) {
        /* a turn's worth for every turn begun since, up to the cap (a debt
         * is paid by all of them) */
        unsigned __int128 add = (unsigned __int128)(uint64_t)(k - (int64_t)ts->k) *
                                sc->credit_ns;
        int64_t room = cap - ts->credit_ns;
        ts->credit_ns = room <= 0 ? ts->credit_ns
                        : add >= (unsigned __int128)room ? cap
                                                         : ts->credit_ns + (int64_t)add;
        ts->k = (uint64_t)k;
        ts->late_ns = 0;
        ts->began = 0;
    }
    if (!ts->init || ts->gen != sc->gen) {
        /* a first look, or a new schedule: at most what is left of the turn
         * now (a debt is kept) */
        int64_t fresh = len > 0 && into < len
                            ? (int64_t)((double)sc->credit_ns * (double)(len - into) / (double)len)
                            : 0;
        ts->credit_ns = ts->init && ts->credit_ns < fresh ? ts->credit_ns : fresh;
        ts->k = (uint64_t)k;
        ts->gen = sc->gen;
        ts->late_ns = 0;
        ts->began = 0;
        ts->init = 1;
    }
    /* A turn that begins late (its launching thread woke late on a loaded
     * host, or the turn before ran over) goes on as much past its end, up to
     * EXTEND_MAX: what a job gets is its credit, not what is left of its
     * span. The job after it waits for its work in flight and for its
     * span's end (turn_end_ns, which it tells through its signal), and ends
     * later too. */
    if (!ts->began && len > 0 && into < len && into > ts->late_ns)
        ts->late_ns = into < VGPU_TURN_WAIT_MAX_NS ? into : VGPU_TURN_WAIT_MAX_NS;
    uint64_t extend = ts->late_ns < VGPU_TURN_EXTEND_MAX_NS ? ts->late_ns
                                                            : VGPU_TURN_EXTEND_MAX_NS;
    /* Past its span's end it goes on only while work of it is in flight:
     * the next turn's job waits for that work (its signal), and for
     * nothing else, so once it ran dry the next turn may have begun, and a
     * launch now would time-slice with it (each job's spans would count the
     * other's slices). A late job whose host left gaps loses the rest of
     * its extension, not its neighbour. */
    int in_turn = len > 0 && (into < len || (into < len + extend && n > 0));

    if (in_turn && sc->credit_ns > 0 && !ts->began && n == 0 && sc->prev &&
        prev_busy_ns > now && ts->late_ns < VGPU_TURN_WAIT_MAX_NS) {
        /* The job of the turn before still has work in flight: wait for it
         * (its overrun is its to pay; it must not count in this job's
         * spans), at most WAIT_MAX into the turn, and end that much later. */
        uint64_t w = prev_busy_ns - now;
        uint64_t late = into + w;
        if (late > VGPU_TURN_WAIT_MAX_NS) {
            late = VGPU_TURN_WAIT_MAX_NS;
            w = late > into ? late - into : 0;
        }
        if (late > ts->late_ns)
            ts->late_ns = late;
        if (w > 0)
            return (struct vgpu_verdict){VGPU_TURN_NAP, w, now - into + len};
    }

    uint64_t turn_end = in_turn ? now - into + len : 0;
    if (in_turn && sc->credit_ns > 0) {
        ts->began = 1;
        go_own.turn_end_ns = turn_end;
        /* A launch that finds nothing in flight goes on what is left if at
         * least half of it is covered (so it overruns by at most half a
         * launch, as often as a turn falls short by as much), or if it is
         * longer than the whole turn (it could never be covered). */
        int64_t left = ts->credit_ns - (int64_t)pending_ns - (int64_t)cost_ns;
        if (left >= 0 || (n == 0 && ts->credit_ns > 0 &&
                          (2 * ts->credit_ns >= (int64_t)cost_ns || cost_ns > sc->credit_ns)))
            return go_own;
        if (n > 0)
            return (struct vgpu_verdict){VGPU_TURN_WAIT_HEAD, 0, turn_end};
        turn_end = now;     /* its credit spent, nothing in flight: done */
    }
    uint64_t open_left = sc->borrow ? left_open(sc, pos) : 0;
    uint64_t open_wait = 0;
    if (open_left > 0 && open_prev_busy_ns > now) {
        /* the job whose turn this span follows still has work in flight
         * (run over its turn's end): borrowed work would time-slice with it
         * and count in its spans. Wait for it, within the span. */
        open_wait = open_prev_busy_ns - now < open_left ? open_prev_busy_ns - now
                                                        : open_left + 1;
        open_left = 0;
    }
    if (open_left > 0) {
        /* borrowed work ends in the open span (the turn after it must not
         * find it running), and keeps at most borrow_ns in flight */
        uint64_t budget = sc->borrow_ns < open_left ? sc->borrow_ns : open_left;
        if (pending_ns + cost_ns <= budget || (n == 0 && cost_ns <= open_left))
            return (struct vgpu_verdict){VGPU_TURN_GO_BORROWED, 0, turn_end};
        if (n > 0)
            return (struct vgpu_verdict){VGPU_TURN_WAIT_HEAD, 0, turn_end};
    }
    /* wait: for the next turn (its start, when this one is spent), or the
     * next open span */
    uint64_t wait = UINT64_MAX;
    if (len > 0 && sc->credit_ns > 0)
        wait = in_turn ? cycle - into : until_span(pos, sc->start_ns, len, cycle);
    if (sc->borrow) {
        /* the next open span (this one, if a launch did not fit what is left
         * of it) */
        uint64_t u = open_wait > 0    ? open_wait
                     : open_left > 0 ? open_left + 1
                                     : until_open(sc, pos);
        if (u < wait)
            wait = u;
    }
    return (struct vgpu_verdict){VGPU_TURN_NAP, wait, turn_end};
}
