/*
 * The native runner's control socket (its end of the server's SOCK_SEQPACKET socket): the
 * server's messages in, with the job's pipes (SCM_RIGHTS), and JSON reports out. Every
 * field of a message is checked before it is used: a number that is not one (NaN,
 * infinities, a sign, spaces, hexadecimal, past its maximum) makes the message a bad one,
 * answered as such. A report that would not fit its buffer is sent as an error, never as
 * cut-short JSON. See _launch.h for the format.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "_launch.h"

/* -- numbers ----------------------------------------------------------------------------- */
int parse_count(const char *text, unsigned long long max, unsigned long long *out) {
  if (text[0] < '0' || text[0] > '9' || strspn(text, "0123456789") != strlen(text)) {
    errno = EINVAL;
    return -1;
  }
  errno = 0;
  unsigned long long value = strtoull(text, NULL, 10);
  if (errno != 0 || value > max) {
    errno = EINVAL;
    return -1;
  }
  *out = value;
  return 0;
}

int parse_id(const char *text, long *out) {
  unsigned long long value;
  if (parse_count(text, LONG_MAX, &value) != 0 || value == 0) return -1;
  *out = (long)value;
  return 0;
}

/* Seconds as Python's repr() writes a float: digits first (no NaN, no infinity, no sign,
 * no space, no hexadecimal), finite, from 0 to MAX_SECONDS. */
static int parse_seconds(const char *text, double *out) {
  if (text[0] < '0' || text[0] > '9' || strspn(text, "0123456789.eE+-") != strlen(text))
    return -1;
  char *end;
  errno = 0;
  double value = strtod(text, &end);
  if (errno != 0 || *end != '\0' || !isfinite(value) || value < 0 || value > MAX_SECONDS)
    return -1;
  *out = value;
  return 0;
}

static int parse_limit(const char *text, rlim_t *out) {
  unsigned long long value;
  if (parse_count(text, MAX_LIMIT, &value) != 0) return -1;
  *out = (rlim_t)value;
  return 0;
}

/* -- messages in ------------------------------------------------------------------------- */
ssize_t receive_message(int sock, char *buf, int fds[3], int *nfds) {
  struct iovec iov = {buf, MAX_MESSAGE - 1};
  union {
    char buf[CMSG_SPACE(3 * sizeof(int))];
    struct cmsghdr align;
  } control;
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
  mh.msg_control = control.buf;
  mh.msg_controllen = sizeof control.buf;
  *nfds = 0;
  ssize_t n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
  if (n < 0) return -1;
  for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c != NULL; c = CMSG_NXTHDR(&mh, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; i++) {
      int fd;
      memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      if (*nfds < 3)
        fds[(*nfds)++] = fd;
      else
        close(fd);
    }
  }
  buf[n] = '\0';
  return mh.msg_flags & MSG_TRUNC ? MAX_MESSAGE : n;
}

int split_fields(char *message, size_t len, char *fields[MAX_FIELDS + 1]) {
  int n = 0;
  for (size_t at = 0; at < len; at += strlen(message + at) + 1) {
    if (n == MAX_FIELDS) return -1;
    fields[n++] = message + at;
  }
  fields[n] = NULL;
  return n;
}

const char *parse_job(char **f, int n, struct job_message *job) {
  /* job ID KIND CWD SEAL TIMEOUT_S CPU_S AS FSIZE NOFILE STACK NPROC NENV ENV... ARG... */
  unsigned long long nenv;
  if (n < JOB_FIELDS + 1 || parse_id(f[1], &job->id) != 0 ||
      parse_count(f[12], MAX_ENV, &nenv) != 0 || (unsigned long long)n < JOB_FIELDS + nenv + 1)
    return "bad job message";
  if (strcmp(f[2], "exec") != 0) return "bad job message: the native runner runs executables";
  if ((strcmp(f[3], "prog") != 0 && strcmp(f[3], "test") != 0) ||
      (strcmp(f[4], "0") != 0 && strcmp(f[4], "1") != 0))
    return "bad job message";
  if (parse_seconds(f[5], &job->timeout_s) != 0) return "bad job message: timeout_s";
  if (parse_seconds(f[6], &job->cpu_s) != 0) return "bad job message: cpu_s";
  rlim_t *limits[] = {&job->as, &job->fsize, &job->nofile, &job->stack, &job->nproc};
  for (int i = 0; i < 5; i++)
    if (parse_limit(f[7 + i], limits[i]) != 0) return "bad job message: limits";
  for (unsigned long long i = 0; i < nenv; i++)
    if (strchr(f[JOB_FIELDS + i], '=') == NULL) return "bad job message: environment";
  job->in_test = strcmp(f[3], "test") == 0;
  job->seal = strcmp(f[4], "1") == 0;
  job->nenv = (int)nenv;
  job->env = f + JOB_FIELDS;
  job->argv = f + JOB_FIELDS + nenv;
  return NULL;
}

/* -- reports out ------------------------------------------------------------------------- */
void put(struct report *r, const char *fmt, ...) {
  if (r->overflow) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(r->text + r->len, sizeof r->text - r->len, fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= sizeof r->text - r->len)
    r->overflow = 1;
  else
    r->len += (size_t)n;
}

void put_string(struct report *r, const char *text) {
  if (text == NULL) {
    put(r, "null");
    return;
  }
  put(r, "\"");
  size_t len = strnlen(text, 1025);
  for (size_t i = 0; i < len && i < 1024; i++) {
    unsigned char c = (unsigned char)text[i];
    if (c < 0x20 || c >= 0x7f || c == '"' || c == '\\')
      put(r, "\\u%04x", c);
    else
      put(r, "%c", c);
  }
  put(r, len > 1024 ? "...\"" : "\"");
}

void send_report(int sock, const struct report *r, long id) {
  struct report instead = {.len = 0};
  if (r->overflow) {
    if (id > 0)
      put(&instead, "{\"op\":\"done\",\"id\":%ld,\"error\":", id);
    else
      put(&instead, "{\"op\":\"fatal\",\"error\":");
    put(&instead, "\"the runner's report passed %d bytes\"}", REPORT_BYTES);
    r = &instead;
  }
  ssize_t sent = send(sock, r->text, r->len, MSG_NOSIGNAL);
  (void)sent; /* nothing more to do if the server is gone */
}

void reply(int sock, long id, const char *error) {
  struct report r = {.len = 0};
  put(&r, "{\"op\":\"done\",\"id\":%ld,\"error\":", id);
  put_string(&r, error);
  put(&r, "}");
  send_report(sock, &r, id);
}
