/*
 * The sandbox's native side (one executable, "launch"): _launch.c starts one program
 * isolated and limited; _serve.c is the runner of an item whose programs are executables.
 */
#ifndef REWARD_SANDBOX_LAUNCH_H
#define REWARD_SANDBOX_LAUNCH_H

#include <sys/resource.h>

/* Where a failure before the program starts is written (close-on-exec). */
#define REPORT_FD 3

/* One program's start: "u" (a sandbox: a user namespace of the run's own, no further
 * namespaces) or "p" (no sandbox: killed when its parent dies); NPROC 0: no limit. */
struct run {
  const char *mode;
  const char *cwd;
  rlim_t cpu, as, fsize, nofile, stack, nproc;
  char **argv;
};

/* With the run's pipes as 0-2 and the report pipe as REPORT_FD, isolate, limit and exec
 * the program with `environ` as its environment; a failure is written on REPORT_FD, then
 * _exit(127). */
_Noreturn void start_program(const struct run *run);

/* A decimal number (no sign); 0, or -1 with errno EINVAL. */
int parse_number(const char *text, rlim_t *out);

/* Write a whole short file; 0, or -1 with errno set. */
int put_file(const char *path, const char *text);

/* Enter a new user namespace (with `extra` namespaces, e.g. CLONE_NEWNS) mapping only our
 * own ids; 0, or -1 with errno set and *what naming the step. */
int own_user_namespace(int extra, const char **what);

/* The runner: `launch serve MODE ROOT CONTROL_FD WORKDIR_BYTES INODES -- FILE...`. */
int serve(int argc, char **argv);

#endif
