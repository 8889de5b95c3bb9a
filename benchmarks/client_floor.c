/* The C floor of a streaming client on this host (issue 20), for benchmarks/client_floor.py.
 *
 * What `bare` does in Python, in C: epoll (level-triggered, as libuv uses it), one
 * non-blocking kept-alive socket per stream, a closed loop (a stream sends its next request
 * as soon as the read that ends its response arrives), and per read: one recv (or recvmsg
 * with the kernel's receive timestamp, -k), one clock_gettime(CLOCK_MONOTONIC) kept in an
 * array, and just enough framing to count tokens ('"text":' occurrences, as `bare` counts
 * them) and to see the response's last chunk ("0\r\n\r\n"). No JSON parsing.
 *
 * The socket options under test (issue 20, item 2) are flags, so one binary measures each:
 *   -q        TCP_QUICKACK 0 after every read (delayed ACKs: Linux leaves that mode by itself)
 *   -Q        TCP_QUICKACK 1 after every read (an ACK for every read)
 *   -o        TCP_QUICKACK 0 once per request, after its send (delayed ACKs while they last)
 *   -r BYTES  SO_RCVBUF before connect
 *   -n        no TCP_NODELAY (default: set, as bench sets it)
 *   -b USEC   SO_BUSY_POLL
 *   -k        SO_TIMESTAMPNS and recvmsg (bench's kernel clock) instead of recv
 *
 * Usage: client_floor PORT STREAMS TOKENS MODEL WARMUP_S SECONDS [flags]
 * Prints one JSON line: tokens/s and CPU (getrusage of this process) per token in the
 * measured window, and this client's own syscall counts per token in it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#ifndef SO_TIMESTAMPNS
#define SO_TIMESTAMPNS 35
#endif
#ifndef SO_BUSY_POLL
#define SO_BUSY_POLL 46
#endif

#define READ_SIZE 65536
#define MAX_EVENTS 1024 /* as libuv asks of one epoll_wait */
#define STAMPS (1 << 22) /* a ring of read stamps: kept, as `bare` keeps them */

typedef struct {
    int fd;
    char tail[4]; /* the last bytes of the previous read: the end marker may straddle reads */
    int tail_len;
} stream_t;

static int64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static double tv_s(struct timeval tv) { return tv.tv_sec + tv.tv_usec / 1e6; }

static void die(const char *what) {
    perror(what);
    exit(1);
}

static int quickack = -1, quickack_once = 0, rcvbuf = 0, nodelay = 1, busy_poll = 0, kernel_clock = 0;
static char request[1024];
static int request_len;

static int open_stream(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) die("socket");
    int one = 1;
    if (nodelay && setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) < 0) die("TCP_NODELAY");
    if (rcvbuf && setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf)) < 0) die("SO_RCVBUF");
    if (busy_poll && setsockopt(fd, SOL_SOCKET, SO_BUSY_POLL, &busy_poll, sizeof(busy_poll)) < 0) die("SO_BUSY_POLL");
    if (kernel_clock && setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof(one)) < 0) die("SO_TIMESTAMPNS");
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) die("connect");
    if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) < 0) die("O_NONBLOCK");
    return fd;
}

static long count_text(const char *p, size_t n) {
    long k = 0;
    const char *end = p + n;
    while (p < end) {
        const char *q = memmem(p, end - p, "\"text\":", 7);
        if (!q) break;
        k++;
        p = q + 7;
    }
    return k;
}

int main(int argc, char **argv) {
    if (argc < 7) {
        fprintf(stderr, "usage: %s PORT STREAMS TOKENS MODEL WARMUP_S SECONDS [-q|-Q|-o] [-r BYTES] [-n] [-b USEC] [-k]\n", argv[0]);
        return 2;
    }
    int port = atoi(argv[1]), n = atoi(argv[2]), tokens = atoi(argv[3]);
    const char *model = argv[4];
    double warmup = atof(argv[5]), seconds = atof(argv[6]);
    for (int i = 7; i < argc; i++) {
        if (!strcmp(argv[i], "-q")) quickack = 0;
        else if (!strcmp(argv[i], "-Q")) quickack = 1;
        else if (!strcmp(argv[i], "-o")) quickack_once = 1;
        else if (!strcmp(argv[i], "-r") && i + 1 < argc) rcvbuf = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-n")) nodelay = 0;
        else if (!strcmp(argv[i], "-b") && i + 1 < argc) busy_poll = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-k")) kernel_clock = 1;
        else {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        }
    }
    char prompt[129];
    memset(prompt, 'x', 128);
    prompt[128] = 0;
    char body[512];
    int body_len = snprintf(body, sizeof(body),
                            "{\"model\":\"%s\",\"prompt\":\"%s\",\"max_tokens\":%d,\"stream\":true,"
                            "\"stream_options\":{\"include_usage\":true,\"continuous_usage_stats\":true}}",
                            model, prompt, tokens);
    request_len = snprintf(request, sizeof(request),
                           "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
                           "Content-Length: %d\r\n\r\n%s", port, body_len, body);

    int ep = epoll_create1(0);
    if (ep < 0) die("epoll_create1");
    stream_t *streams = calloc(n, sizeof(stream_t));
    for (int i = 0; i < n; i++) {
        streams[i].fd = open_stream(port);
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &streams[i]};
        if (epoll_ctl(ep, EPOLL_CTL_ADD, streams[i].fd, &ev) < 0) die("epoll_ctl");
        if (send(streams[i].fd, request, request_len, 0) != request_len) die("send");
        if (quickack_once) setsockopt(streams[i].fd, IPPROTO_TCP, TCP_QUICKACK, &(int){0}, sizeof(int));
    }
    static char buf[READ_SIZE];
    static struct epoll_event events[MAX_EVENTS];
    int64_t *stamps = malloc(sizeof(int64_t) * STAMPS);
    long nstamps = 0;
    int64_t start = mono_ns();
    int64_t t0 = start + (int64_t)(warmup * 1e9), t1 = t0 + (int64_t)(seconds * 1e9);
    int in_window = 0;
    struct rusage r0, r1;
    long tok = 0, reads = 0, waits = 0, recvs = 0, sends = 0, sockopts = 0, responses = 0;
    int64_t w0 = 0, w1 = 0;
    char anc[CMSG_SPACE(sizeof(struct timespec))];
    for (;;) {
        int64_t now = mono_ns();
        if (!in_window && now >= t0) {
            getrusage(RUSAGE_SELF, &r0);
            w0 = now;
            in_window = 1;
            tok = reads = waits = recvs = sends = sockopts = responses = 0;
        } else if (in_window && now >= t1) {
            getrusage(RUSAGE_SELF, &r1);
            w1 = now;
            break;
        }
        int64_t until = in_window ? t1 : t0;
        int timeout = (int)((until - now) / 1000000) + 1;
        int k = epoll_wait(ep, events, MAX_EVENTS, timeout);
        waits++;
        if (k < 0) {
            if (errno == EINTR) continue;
            die("epoll_wait");
        }
        for (int e = 0; e < k; e++) {
            stream_t *s = events[e].data.ptr;
            ssize_t got;
            int64_t ts;
            if (kernel_clock) {
                struct iovec iov = {buf, READ_SIZE};
                struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = anc, .msg_controllen = sizeof(anc)};
                got = recvmsg(s->fd, &msg, 0);
                ts = mono_ns();
                struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
                if (got > 0 && c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SO_TIMESTAMPNS) {
                    struct timespec kt;
                    memcpy(&kt, CMSG_DATA(c), sizeof(kt));
                    (void)kt; /* the stamp is read (as bench reads it); the ring keeps the user one */
                }
            } else {
                got = recv(s->fd, buf, READ_SIZE, 0);
                ts = mono_ns();
            }
            recvs++;
            if (got < 0) {
                if (errno == EAGAIN || errno == EINTR) continue;
                die("recv");
            }
            if (got == 0) {
                fprintf(stderr, "the engine closed a connection\n");
                return 1;
            }
            stamps[nstamps++ & (STAMPS - 1)] = ts;
            reads++;
            if (quickack >= 0) {
                setsockopt(s->fd, IPPROTO_TCP, TCP_QUICKACK, &quickack, sizeof(quickack));
                sockopts++;
            }
            tok += count_text(buf, got);
            /* the response's last chunk, possibly split across reads */
            char last[9];
            int m = got >= 5 ? 0 : s->tail_len;
            memcpy(last, s->tail + (s->tail_len - m), m);
            int take = got >= 5 ? 5 : (int)got;
            memcpy(last + m, buf + got - take, take);
            int len = m + take;
            if (len >= 5 && !memcmp(last + len - 5, "0\r\n\r\n", 5)) {
                responses++;
                s->tail_len = 0;
                if (send(s->fd, request, request_len, 0) != request_len) die("send");
                sends++;
                if (quickack_once) {
                    setsockopt(s->fd, IPPROTO_TCP, TCP_QUICKACK, &(int){0}, sizeof(int));
                    sockopts++;
                }
            } else {
                int keep = len < 4 ? len : 4;
                memcpy(s->tail, last + len - keep, keep);
                s->tail_len = keep;
            }
        }
    }
    double dt = (w1 - w0) / 1e9;
    double user = tv_s(r1.ru_utime) - tv_s(r0.ru_utime), sys = tv_s(r1.ru_stime) - tv_s(r0.ru_stime);
    double t = tok ? (double)tok : 1.0 / 0.0;
    printf("{\"mode\": \"c\", \"streams\": %d, \"tok_s\": %.1f, \"reads_per_token\": %.4f, \"user_us_tok\": %.3f, "
           "\"sys_us_tok\": %.3f, \"epoll_wait_per_token\": %.4f, \"recv_per_token\": %.4f, \"send_per_token\": %.4f, "
           "\"setsockopt_per_token\": %.4f, \"vcsw_per_token\": %.4f, \"ivcsw_per_token\": %.4f, \"responses\": %ld, "
           "\"stamps\": %ld}\n",
           n, tok / dt, reads / t, user / t * 1e6, sys / t * 1e6, waits / t, recvs / t, sends / t, sockopts / t,
           (r1.ru_nvcsw - r0.ru_nvcsw) / t, (r1.ru_nivcsw - r0.ru_nivcsw) / t, responses, nstamps);
    fflush(stdout);
    _exit(0); /* the sockets are mid-stream: no orderly close needed */
}
