/*
 * The sandbox's native runner, one executable ("launch"), in three files:
 *
 *   _serve.c    the runner, PID 1 of an item's sandbox whose programs are executables: its
 *               jobs, their folders and processes, its loop, main()
 *   _message.c  its control socket: the server's messages in (every field checked), JSON
 *               reports out (one that does not fit is an error, never cut short)
 *   _launch.c   one program's start: isolated, limited, exec'd
 *
 * Built by reward_server/sandbox/_launcher.py with -Wall -Wextra -Werror and the hardening
 * flags the compiler accepts. Standard C and Linux calls only; the runner's own memory is
 * static (messages, fields, jobs, a job's environment): no allocation of its own to fail.
 */
#ifndef REWARD_SANDBOX_LAUNCH_H
#define REWARD_SANDBOX_LAUNCH_H

#include <stddef.h>
#include <sys/resource.h>
#include <sys/types.h>

/* -- _launch.c: one program's start ------------------------------------------------------ */

/* Where a failure before the program starts is written (close-on-exec). */
#define REPORT_FD 3

/* One program's start: "u" (a sandbox: a user namespace of the run's own, no further
 * namespaces) or "p" (no sandbox: killed when its parent dies); NPROC 0: no limit. */
struct run {
  const char *mode;
  const char *cwd;
  rlim_t cpu, as, fsize, nofile, stack, nproc;
  char **argv;
  char **envp;
};

/* With the run's pipes as 0-2 and the report pipe as REPORT_FD, isolate, limit and exec
 * the program with `envp` as its environment; a failure is written on REPORT_FD, then
 * _exit(127). */
_Noreturn void start_program(const struct run *run);

/* Write a whole short file; 0, or -1 with errno set. */
int put_file(const char *path, const char *text);

/* Enter a new user namespace (with `extra` namespaces, e.g. CLONE_NEWNS) mapping only our
 * own ids; 0, or -1 with errno set and *what naming the step. */
int own_user_namespace(int extra, const char **what);

/* -- _message.c: the control socket ------------------------------------------------------ */

/* A message from the server: fields separated by NUL bytes,
 *   job ID KIND CWD SEAL TIMEOUT_S CPU_S AS FSIZE NOFILE STACK NPROC NENV KEY=VALUE... ARG...
 *   seal ID        kill ID
 * KIND exec (this runner; the Python runner takes python and pycheck), CWD prog|test, SEAL
 * 0|1, seconds as Python writes a float (finite, from 0 to MAX_SECONDS), the others whole
 * numbers in decimal digits up to MAX_LIMIT, at most MAX_ENV entries, at least one ARG. */
#define MAX_MESSAGE (1 << 20)
#define MAX_FIELDS 4096
#define MAX_ENV 64
#define MAX_SECONDS 1e9
#define MAX_LIMIT (1ULL << 48)
#define JOB_FIELDS 13 /* the fields of a job message before its environment */

struct job_message {
  long id;
  int in_test, seal;
  double timeout_s, cpu_s;
  rlim_t as, fsize, nofile, stack, nproc;
  int nenv;
  char **env;  /* KEY=VALUE entries */
  char **argv; /* NULL-terminated */
};

/* A whole number written in decimal digits only (no sign, no space), at most `max`; 0, or
 * -1 with errno EINVAL. */
int parse_count(const char *text, unsigned long long max, unsigned long long *out);

/* A message's ID (1 up to LONG_MAX); 0, or -1. */
int parse_id(const char *text, long *out);

/* Read one message (at most MAX_MESSAGE - 1 bytes, NUL-terminated in `buf`) and up to 3
 * descriptors; its length, MAX_MESSAGE when it was longer, 0 at EOF, -1 on error. */
ssize_t receive_message(int sock, char *buf, int fds[3], int *nfds);

/* Point `fields` at the message's fields (NULL after the last); their count, -1 if more
 * than MAX_FIELDS. */
int split_fields(char *message, size_t len, char *fields[MAX_FIELDS + 1]);

/* A job message's fields checked and read into *job; NULL, or what is wrong. */
const char *parse_job(char **fields, int n, struct job_message *job);

/* A JSON object to the server. */
#define REPORT_BYTES 16384
struct report {
  char text[REPORT_BYTES];
  size_t len;
  int overflow; /* something did not fit: the report is not sent as it is */
};

void put(struct report *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A JSON string of at most the first 1024 bytes of `text` (more: cut and marked "..."),
 * every byte outside printable ASCII escaped (the server parses UTF-8, and a program's bytes
 * need not be); NULL is null. */
void put_string(struct report *r, const char *text);

/* Send the report; one that overflowed is sent as a job's error instead (id > 0: a done
 * report, else a fatal one), never as invalid JSON. MSG_NOSIGNAL: a server gone is seen as
 * EOF by the loop, not as SIGPIPE. */
void send_report(int sock, const struct report *r, long id);

/* {"op":"done","id":ID,"error":ERROR} (ERROR NULL: null). */
void reply(int sock, long id, const char *error);

#endif
