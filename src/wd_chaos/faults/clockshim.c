/* A preload library that moves a process's wall clock by the offset a control file holds, for the
 * clock-step fault on servers libfaketime cannot run in. Debian's redis-server is linked with
 * jemalloc, whose start-up reads the clock before libfaketime has initialised, and the two hang
 * each other (libfaketime issue #130, open). This library needs no initialisation: it allocates
 * nothing, resolves no symbol, and reads the clock through the raw system call.
 *
 * WD_CLOCK_FILE names the control file: one line, a signed number of seconds ("+6.000", "-6"),
 * the form libfaketime's FAKETIME_TIMESTAMP_FILE takes, re-read on every call so a step lands at
 * once. Only the wall clock (CLOCK_REALTIME and its coarse form, gettimeofday, time) moves: an
 * NTP step leaves CLOCK_MONOTONIC alone, and so does this. Without the variable, or with the file
 * missing or unreadable, the offset is zero.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static char control[4096];

/* Copied at load: a server that sets its process title (Redis, Postgres) overwrites the memory
 * the environment was in. */
__attribute__((constructor)) static void find_control(void) {
    const char *given = getenv("WD_CLOCK_FILE");
    for (size_t i = 0; given != NULL && given[i] != '\0' && i < sizeof control - 1; i++) control[i] = given[i];
}

/* The offset in nanoseconds; parsed by hand, since strtod may consult the locale. */
static long long offset_ns(void) {
    char text[64];
    if (control[0] == '\0') return 0;
    int fd = (int)syscall(SYS_openat, AT_FDCWD, control, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    long n = syscall(SYS_read, fd, text, sizeof text - 1);
    syscall(SYS_close, fd);
    if (n <= 0) return 0;
    text[n] = '\0';
    const char *p = text;
    int sign = 1;
    if (*p == '+' || *p == '-') sign = (*p++ == '-') ? -1 : 1;
    long long whole = 0, frac = 0, scale = 1000000000LL;
    while (*p >= '0' && *p <= '9') whole = whole * 10 + (*p++ - '0');
    if (*p == '.') {
        p++;
        while (*p >= '0' && *p <= '9' && scale > 1) {
            scale /= 10;
            frac += (*p++ - '0') * scale;
        }
    }
    return sign * (whole * 1000000000LL + frac);
}

static void shift(struct timespec *ts) {
    long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + offset_ns();
    ts->tv_sec = (time_t)(ns / 1000000000LL);
    ts->tv_nsec = (long)(ns % 1000000000LL);
    if (ts->tv_nsec < 0) {
        ts->tv_nsec += 1000000000L;
        ts->tv_sec -= 1;
    }
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    int rc = (int)syscall(SYS_clock_gettime, clock, ts);
    if (rc == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)) shift(ts);
    return rc;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    struct timespec ts;
    int rc = (int)syscall(SYS_clock_gettime, CLOCK_REALTIME, &ts);
    if (rc != 0) return rc;
    shift(&ts);
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
    (void)tz;
    return 0;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out != NULL) *out = ts.tv_sec;
    return ts.tv_sec;
}
