/*
 * The native runner: PID 1 of an item's sandbox whose programs are executables (compiled
 * programs, node, java). It does _runner.py's job without an interpreter's start, which is
 * most of such an item's start-up:
 *
 *   launch serve MODE ROOT CONTROL_FD WORKDIR_BYTES INODES -- FILE...
 *
 * MODE "bwrap" (PID 1 of the sandbox's PID namespace) or "none" (a plain process, a
 * subreaper); ROOT holds prog/ (the item's FILEs) and work/; CONTROL_FD is its end of the
 * server's SOCK_SEQPACKET socket.
 *
 * At start, in bwrap mode, it enters a user and mount namespace of its own: the work
 * directory becomes a tmpfs with a size and an inode cap (bwrap cannot cap inodes), and
 * prog/ is remounted read-only once built ("seal"). Each job is a fork of this small
 * program that calls start_program() (_launch.c) in a fresh directory work/tN holding links
 * to the item's files (the build runs in prog/). The runner kills a job at its wall-clock
 * deadline (its process group, then whatever escaped it: orphans come back to PID 1, and a
 * scan kills them five times a second) and reports its wait status, CPU and wall time.
 * When the socket closes, it kills everything and exits.
 *
 * Messages from the server (reward_server/sandbox/_channel.py's native_message): fields
 * separated by NUL bytes,
 *   job ID CWD(prog|test) SEAL(0|1) TIMEOUT_S CPU_S AS FSIZE NOFILE STACK NPROC
 *       NENV KEY=VALUE... PROGRAM ARGS...     with the job's stdin, stdout, stderr attached
 *   seal ID        kill ID
 * and to it JSON objects, the Python runner's: ready, fatal, done.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "_launch.h"

#define MAX_JOBS 256
#define MAX_MESSAGE (1 << 20)
#define MAX_CHILDREN 8192
#define SCAN_S 0.2   /* seconds between scans for processes that escaped their job */
#define SETTLE_S 0.25 /* at most this long killing a finished job's leftovers at once */
#define RMTREE_DEPTH 200

extern char **environ;

struct job {
  long id;
  pid_t pid; /* 0: a free slot */
  int err_r;
  int seal, timed_out, killed;
  double started, deadline;
  unsigned test; /* its directory work/tN; 0: none (the build runs in prog/) */
};

struct ended {
  struct job job;
  int status;
  struct rusage usage;
  double at;
};

static struct {
  int bwrap, ctl;
  const char *root;
  char prog[1024], work[1024]; /* ROOT is short: /sandbox, or a temporary folder */
  char **files;
  int nfiles;
  struct job jobs[MAX_JOBS];
  unsigned counter;
  double next_scan;
} R;

static char message[MAX_MESSAGE];

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* -- JSON to the server ------------------------------------------------------------------ */
struct out {
  char buf[16384];
  size_t len;
};

static void put(struct out *o, const char *fmt, ...) {
  if (o->len >= sizeof o->buf) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(o->buf + o->len, sizeof o->buf - o->len, fmt, ap);
  va_end(ap);
  if (n > 0) o->len += (size_t)n;
  if (o->len > sizeof o->buf - 1) o->len = sizeof o->buf - 1;
}

/* A JSON string; control characters, quotes, backslashes and every byte above ASCII
 * escaped (the server parses UTF-8, and a program's bytes need not be). */
static void put_string(struct out *o, const char *text) {
  if (text == NULL) {
    put(o, "null");
    return;
  }
  put(o, "\"");
  for (const unsigned char *c = (const unsigned char *)text; *c; c++) {
    if (*c < 0x20 || *c >= 0x7f || *c == '"' || *c == '\\')
      put(o, "\\u%04x", *c);
    else
      put(o, "%c", *c);
  }
  put(o, "\"");
}

static void send_out(struct out *o) {
  /* MSG_NOSIGNAL: a server gone is seen as EOF by the loop, not as SIGPIPE. */
  ssize_t sent = send(R.ctl, o->buf, o->len, MSG_NOSIGNAL);
  (void)sent;
}

static void reply(long id, const char *error) {
  struct out o = {.len = 0};
  put(&o, "{\"op\":\"done\",\"id\":%ld,\"error\":", id);
  put_string(&o, error);
  put(&o, "}");
  send_out(&o);
}

static void replyf(long id, const char *fmt, ...) {
  char text[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  reply(id, text);
}

/* -- the item's folders ------------------------------------------------------------------ */
static int make_dirs(char *path) { /* mkdir -p, in place */
  for (char *slash = strchr(path + 1, '/'); slash != NULL; slash = strchr(slash + 1, '/')) {
    *slash = '\0';
    int made = mkdir(path, 0700);
    *slash = '/';
    if (made != 0 && errno != EEXIST) return -1;
  }
  return mkdir(path, 0700) != 0 && errno != EEXIST ? -1 : 0;
}

/* A fresh directory holding links to the program's files (read-only). */
static int make_test_dir(const char *tdir) {
  char link[PATH_MAX], target[PATH_MAX];
  if (mkdir(tdir, 0700) != 0) return -1;
  for (int i = 0; i < R.nfiles; i++) {
    if (snprintf(link, sizeof link, "%s/%s", tdir, R.files[i]) >= (int)sizeof link ||
        snprintf(target, sizeof target, "%s/%s", R.prog, R.files[i]) >= (int)sizeof target) {
      errno = ENAMETOOLONG;
      return -1;
    }
    char *parent = strrchr(link, '/');
    if (parent - link > (ptrdiff_t)strlen(tdir)) { /* a file in a subfolder */
      *parent = '\0';
      int made = make_dirs(link);
      *parent = '/';
      if (made != 0) return -1;
    }
    if (symlink(target, link) != 0) return -1;
  }
  return 0;
}

/* Remove `name` under `parent` whatever the program did to it (modes, links); 0 if gone. */
static int remove_tree(int parent, const char *name, int depth) {
  if (unlinkat(parent, name, 0) == 0) return 0;
  if (errno != EISDIR && errno != EPERM) return errno == ENOENT ? 0 : -1;
  fchmodat(parent, name, 0700, 0);
  int fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0) {
    DIR *dir = depth < RMTREE_DEPTH ? fdopendir(fd) : NULL;
    if (dir == NULL) {
      close(fd);
    } else {
      /* Entries removed while reading may hide others: read again until a pass is empty. */
      for (int pass = 0, removed = 1; removed && pass < 4; pass++) {
        removed = 0;
        rewinddir(dir);
        for (struct dirent *e; (e = readdir(dir)) != NULL;) {
          if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            removed += remove_tree(dirfd(dir), e->d_name, depth + 1) == 0;
        }
      }
      closedir(dir);
    }
  }
  return unlinkat(parent, name, AT_REMOVEDIR);
}

static void test_dir(char *out, size_t size, unsigned test) {
  snprintf(out, size, "%s/t%u", R.work, test);
}

/* The program's folder read-only, its build included (the whole tmpfs holding it; the work
 * directory is a mount of its own and stays writable). */
static int seal(void) {
  if (!R.bwrap) return 0;
  return mount(NULL, R.root, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV,
               NULL);
}

/* -- processes --------------------------------------------------------------------------- */
static struct job *job_by_pid(pid_t pid) {
  for (int i = 0; i < MAX_JOBS; i++)
    if (R.jobs[i].pid == pid && pid != 0) return &R.jobs[i];
  return NULL;
}

static struct job *job_by_id(long id) {
  for (int i = 0; i < MAX_JOBS; i++)
    if (R.jobs[i].pid != 0 && R.jobs[i].id == id) return &R.jobs[i];
  return NULL;
}

static int active_jobs(void) {
  int count = 0;
  for (int i = 0; i < MAX_JOBS; i++) count += R.jobs[i].pid != 0;
  return count;
}

static void kill_job(const struct job *job) {
  kill(-job->pid, SIGKILL);
  kill(job->pid, SIGKILL);
}

/* The runner's children, from /proc (orphans are re-parented to it). */
static int children(pid_t *out, int max) {
  static char text[MAX_CHILDREN * 8];
  char path[64];
  pid_t self = getpid();
  snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)self, (int)self);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  size_t len = 0;
  for (ssize_t n; len < sizeof text - 1 && (n = read(fd, text + len, sizeof text - 1 - len));) {
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    len += (size_t)n;
  }
  close(fd);
  text[len] = '\0';
  int count = 0;
  for (char *p = text, *end; count < max; p = end) {
    long pid = strtol(p, &end, 10);
    if (end == p) break;
    out[count++] = (pid_t)pid;
  }
  return count;
}

/* Kill every child that is not a job (it outlived the job that started it); any found. */
static int kill_orphans(int reap) {
  static pid_t kids[MAX_CHILDREN];
  int count = children(kids, MAX_CHILDREN), found = 0;
  for (int i = 0; i < count; i++) {
    if (job_by_pid(kids[i]) != NULL) continue;
    found = 1;
    kill(kids[i], SIGKILL);
    if (reap) waitpid(kids[i], NULL, WNOHANG);
  }
  return found;
}

/* Kill and reap the children that are not jobs until there are none (their parents just
 * died, so they are still being re-parented here), for at most SETTLE_S; the periodic scan
 * gets any that come later. */
static void settle(void) {
  double deadline = now() + SETTLE_S;
  while (kill_orphans(1) && now() <= deadline) {
    struct timespec pause = {0, 2000000};
    nanosleep(&pause, NULL);
  }
}

/* -- jobs -------------------------------------------------------------------------------- */
/* The job's environment: the runner's (the sandbox's), with the message's entries over it. */
static char **job_environment(char **entries, int count) {
  int base = 0;
  while (environ[base] != NULL) base++;
  char **env = calloc((size_t)(base + count + 1), sizeof *env);
  if (env == NULL) return environ;
  int n = 0;
  for (int i = 0; i < base; i++) {
    size_t key = strcspn(environ[i], "=");
    int replaced = 0;
    for (int j = 0; j < count && !replaced; j++)
      replaced = strncmp(entries[j], environ[i], key + 1) == 0;
    if (!replaced) env[n++] = environ[i];
  }
  for (int j = 0; j < count; j++) env[n++] = entries[j];
  return env;
}

/* The forked job: the run's pipes as 0-2 and the report pipe as 3 (moved above 9 first so
 * that no move overwrites a later one's source), then the launcher's steps. */
static _Noreturn void job_child(const int fds[3], int err_w, struct run *run, char **env,
                                int nenv) {
  int moved[4], sources[4] = {fds[0], fds[1], fds[2], err_w};
  for (int i = 0; i < 4; i++)
    if ((moved[i] = fcntl(sources[i], F_DUPFD_CLOEXEC, 10)) < 0) _exit(127);
  for (int i = 0; i < 4; i++)
    if (dup2(moved[i], i) != i) _exit(127);
  environ = job_environment(env, nenv);
  start_program(run);
}

/* Start a job from its message; whether it took the descriptors. */
static int start_job(char **f, int n, const int fds[3], int nfds) {
  long id = strtol(f[1], NULL, 10);
  rlim_t v[6], nenv;
  double timeout_s, cpu_s;
  /* job ID CWD SEAL TIMEOUT CPU AS FSIZE NOFILE STACK NPROC NENV ENV... ARGV... */
  if (n < 13 || sscanf(f[4], "%lf", &timeout_s) != 1 || sscanf(f[5], "%lf", &cpu_s) != 1 ||
      !(cpu_s >= 0 && cpu_s < 1e9) || parse_number(f[11], &nenv) != 0 || nenv > (rlim_t)n ||
      (rlim_t)n < 13 + nenv) {
    reply(id, "bad job message");
    return 0;
  }
  /* RLIMIT_CPU's whole seconds: the limit rounded up (start_program makes it at least 1). */
  v[0] = (rlim_t)cpu_s;
  if ((double)v[0] < cpu_s) v[0]++;
  for (int i = 1; i < 6; i++) {
    if (parse_number(f[5 + i], &v[i]) != 0) {
      reply(id, "bad job message: limits");
      return 0;
    }
  }
  if (nfds != 3) {
    reply(id, "expected 3 pipes");
    return 0;
  }
  struct job *job = NULL;
  for (int i = 0; i < MAX_JOBS && job == NULL; i++)
    if (R.jobs[i].pid == 0) job = &R.jobs[i];
  if (job == NULL) {
    reply(id, "too many jobs at once");
    return 0;
  }
  int in_test = strcmp(f[2], "prog") != 0;
  char cwd[PATH_MAX];
  unsigned test = 0;
  if (in_test) {
    test = ++R.counter;
    test_dir(cwd, sizeof cwd, test);
    if (make_test_dir(cwd) != 0) {
      replyf(id, "work dir: %s", strerror(errno));
      remove_tree(AT_FDCWD, cwd, 0);
      return 0;
    }
  } else {
    snprintf(cwd, sizeof cwd, "%s", R.prog);
  }
  int err[2];
  if (pipe2(err, O_CLOEXEC) != 0) {
    replyf(id, "pipe: %s", strerror(errno));
    if (test) remove_tree(AT_FDCWD, cwd, 0);
    return 0;
  }
  struct run run = {
      .mode = R.bwrap ? "u" : "p",
      .cwd = cwd,
      .cpu = v[0],
      .as = v[1],
      .fsize = v[2],
      .nofile = v[3],
      .stack = v[4],
      .nproc = v[5],
      .argv = f + 12 + nenv,
  };
  pid_t pid = fork();
  if (pid == 0) job_child(fds, err[1], &run, f + 12, (int)nenv);
  int saved = errno;
  close(err[1]);
  if (pid < 0) {
    close(err[0]);
    replyf(id, "fork: %s", strerror(saved));
    if (test) remove_tree(AT_FDCWD, cwd, 0);
    return 0;
  }
  for (int i = 0; i < 3; i++) close(fds[i]);
  double started = now();
  *job = (struct job){
      .id = id,
      .pid = pid,
      .err_r = err[0],
      .seal = strcmp(f[3], "1") == 0,
      .started = started,
      .deadline = started + timeout_s,
      .test = test,
  };
  return 1;
}

static void finish(struct ended *e) {
  char failure[4096 + 1], error[4200], tdir[PATH_MAX];
  const char *why = NULL;
  fcntl(e->job.err_r, F_SETFL, O_NONBLOCK);
  ssize_t got = read(e->job.err_r, failure, sizeof failure - 1);
  close(e->job.err_r);
  if (got > 0) {
    failure[got] = '\0';
    snprintf(error, sizeof error, "job setup: %s", failure);
    why = error;
  }
  if (e->job.seal && seal() != 0) {
    snprintf(error, sizeof error, "seal: %s", strerror(errno));
    why = error;
  }
  if (e->job.test) {
    test_dir(tdir, sizeof tdir, e->job.test);
    remove_tree(AT_FDCWD, tdir, 0);
  }
  struct out o = {.len = 0};
  const struct rusage *u = &e->usage;
  double cpu = (double)u->ru_utime.tv_sec + (double)u->ru_utime.tv_usec / 1e6 +
               (double)u->ru_stime.tv_sec + (double)u->ru_stime.tv_usec / 1e6;
  put(&o, "{\"op\":\"done\",\"id\":%ld,\"status\":%d,\"timed_out\":%s,\"killed\":%s,", e->job.id,
      e->status, e->job.timed_out ? "true" : "false", e->job.killed ? "true" : "false");
  put(&o, "\"cpu_s\":%.6f,\"maxrss_kb\":%ld,\"wall_s\":%.6f,\"error\":", cpu, u->ru_maxrss,
      e->at - e->job.started);
  put_string(&o, why);
  put(&o, "}");
  send_out(&o);
}

/* Collect every child that exited; report the jobs among them once whatever they left
 * behind is dead. */
static void reap(void) {
  static struct ended ended[MAX_JOBS];
  int count = 0;
  for (;;) {
    int status;
    struct rusage usage;
    pid_t pid = wait4(-1, &status, WNOHANG, &usage);
    if (pid < 0 && errno == EINTR) continue;
    if (pid <= 0) break;
    struct job *job = job_by_pid(pid);
    if (job == NULL) continue; /* an orphan killed, or one that ended on its own */
    ended[count] = (struct ended){*job, status, usage, now()};
    job->pid = 0;
    count++;
  }
  if (count == 0) return;
  for (int i = 0; i < count; i++) kill(-ended[i].job.pid, SIGKILL); /* its group goes too */
  settle();
  for (int i = 0; i < count; i++) finish(&ended[i]);
}

static void check_deadlines(void) {
  double t = now();
  for (int i = 0; i < MAX_JOBS; i++) {
    struct job *job = &R.jobs[i];
    if (job->pid != 0 && !job->timed_out && t >= job->deadline) {
      job->timed_out = 1;
      kill_job(job);
    }
  }
}

/* Milliseconds until the loop must look again: the nearest deadline, or the next scan for
 * escaped processes (five a second while anything runs); -1 when idle. */
static int next_timeout_ms(int orphans) {
  if (!active_jobs() && !orphans) return -1;
  double wake = R.next_scan;
  for (int i = 0; i < MAX_JOBS; i++)
    if (R.jobs[i].pid != 0 && !R.jobs[i].timed_out && R.jobs[i].deadline < wake)
      wake = R.jobs[i].deadline;
  double left = wake - now();
  return left <= 0 ? 0 : (int)(left * 1000) + 1;
}

/* -- messages ---------------------------------------------------------------------------- */
/* One message and up to 3 descriptors; its length, 0 at EOF, -1 on error. */
static ssize_t receive(int fds[3], int *nfds) {
  struct iovec iov = {message, sizeof message - 1};
  union {
    char buf[CMSG_SPACE(3 * sizeof(int))];
    struct cmsghdr align;
  } control;
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
  mh.msg_control = control.buf;
  mh.msg_controllen = sizeof control.buf;
  *nfds = 0;
  ssize_t n = recvmsg(R.ctl, &mh, MSG_CMSG_CLOEXEC);
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
  if (mh.msg_flags & MSG_TRUNC) n = sizeof message; /* too long: handled as a bad message */
  message[n < (ssize_t)sizeof message ? n : (ssize_t)sizeof message - 1] = '\0';
  return n;
}

static void handle(size_t len, int fds[3], int nfds) {
  size_t count = 0;
  for (size_t at = 0; at < len && len < sizeof message; at += strlen(message + at) + 1) count++;
  char **f = calloc(count + 1, sizeof *f);
  int n = 0;
  if (f != NULL && len < sizeof message) {
    for (size_t at = 0; at < len; at += strlen(message + at) + 1) f[n++] = message + at;
  }
  int taken = 0;
  if (n >= 2 && strcmp(f[0], "job") == 0) {
    taken = start_job(f, n, fds, nfds);
  } else if (n >= 2 && strcmp(f[0], "seal") == 0) {
    long id = strtol(f[1], NULL, 10);
    if (seal() != 0)
      replyf(id, "seal: %s", strerror(errno));
    else
      reply(id, NULL);
  } else if (n >= 2 && strcmp(f[0], "kill") == 0) {
    struct job *job = job_by_id(strtol(f[1], NULL, 10));
    if (job != NULL) {
      job->killed = 1;
      kill_job(job);
    }
  } else {
    /* A bad message must not end the item's sandbox. */
    fprintf(stderr, "runner: bad message of %zu bytes\n", len);
  }
  if (!taken)
    for (int i = 0; i < nfds; i++) close(fds[i]);
  free(f);
}

/* -- start and loop ---------------------------------------------------------------------- */
static _Noreturn void fatal(const char *what) {
  struct out o = {.len = 0};
  char text[1024];
  snprintf(text, sizeof text, "%s: %s", what, strerror(errno));
  put(&o, "{\"op\":\"fatal\",\"error\":");
  put_string(&o, text);
  put(&o, "}");
  send_out(&o);
  fprintf(stderr, "runner: %s\n", text);
  exit(1);
}

static void setup(rlim_t workdir_bytes, rlim_t inodes) {
  char path[PATH_MAX + 8];
  put_file("/proc/self/oom_score_adj", "1000"); /* taken before the server */
  signal(SIGINT, SIG_IGN);
  signal(SIGPIPE, SIG_IGN);
  if (R.bwrap) {
    const char *what;
    if (own_user_namespace(CLONE_NEWNS, &what) != 0) fatal(what);
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) fatal("mount /");
    char options[128];
    snprintf(options, sizeof options, "size=%llu,nr_inodes=%llu,mode=0700",
             (unsigned long long)workdir_bytes, (unsigned long long)inodes);
    if (mount("tmpfs", R.work, "tmpfs", MS_NOSUID | MS_NODEV, options) != 0)
      fatal("mount work");
  } else {
    /* Orphans of the programs come back to the runner, which kills them. */
    if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0) fatal("prctl SUBREAPER");
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0) fatal("prctl PDEATHSIG");
    if (mkdir(R.work, 0700) != 0 && errno != EEXIST) fatal(R.work);
  }
  snprintf(path, sizeof path, "%s/tmp", R.work);
  if (mkdir(path, 0700) != 0 && errno != EEXIST) fatal(path);
  /* Programs must not touch the runner: no ptrace, no /proc/1/mem, no core dumps. */
  if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) fatal("prctl DUMPABLE");
}

int serve(int argc, char **argv) {
  /* serve MODE ROOT CONTROL_FD WORKDIR_BYTES INODES -- FILE... */
  rlim_t ctl, workdir_bytes, inodes;
  if (argc < 7 || strcmp(argv[6], "--") != 0 || parse_number(argv[3], &ctl) != 0 ||
      parse_number(argv[4], &workdir_bytes) != 0 || parse_number(argv[5], &inodes) != 0) {
    fprintf(stderr, "usage: launch serve MODE ROOT CONTROL_FD WORKDIR_BYTES INODES -- FILE...\n");
    return 2;
  }
  R.bwrap = strcmp(argv[1], "bwrap") == 0;
  R.root = argv[2];
  R.ctl = (int)ctl;
  R.files = argv + 7;
  R.nfiles = argc - 7;
  snprintf(R.prog, sizeof R.prog, "%s/prog", R.root);
  snprintf(R.work, sizeof R.work, "%s/work", R.root);
  /* Every descriptor of the runner is close-on-exec; jobs get only their own. */
  fcntl(R.ctl, F_SETFD, FD_CLOEXEC);
  setup(workdir_bytes, inodes);
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  sigprocmask(SIG_BLOCK, &chld, NULL);
  int sfd = signalfd(-1, &chld, SFD_NONBLOCK | SFD_CLOEXEC);
  if (sfd < 0) fatal("signalfd");
  struct out ready = {.len = 0};
  put(&ready, "{\"op\":\"ready\",\"pid\":%d,\"runner\":\"native\"}", (int)getpid());
  send_out(&ready);
  int orphans = 0;
  for (;;) {
    struct pollfd polled[2] = {{R.ctl, POLLIN, 0}, {sfd, POLLIN, 0}};
    int ready_fds = poll(polled, 2, next_timeout_ms(orphans));
    if (ready_fds < 0 && errno != EINTR) fatal("poll");
    if (ready_fds > 0 && polled[1].revents) {
      struct signalfd_siginfo info;
      while (read(sfd, &info, sizeof info) > 0) {
      }
    }
    if (ready_fds > 0 && polled[0].revents) {
      int fds[3], nfds;
      ssize_t len = receive(fds, &nfds);
      if (len == 0 || (len < 0 && errno != EINTR && errno != EAGAIN)) {
        for (int i = 0; i < nfds; i++) close(fds[i]);
        for (int i = 0; i < MAX_JOBS; i++)
          if (R.jobs[i].pid != 0) kill_job(&R.jobs[i]);
        kill_orphans(0);
        return 0; /* PID 1 gone: the kernel kills whatever is left in the namespace */
      }
      if (len > 0) handle((size_t)len, fds, nfds);
    }
    reap();
    check_deadlines();
    if (now() >= R.next_scan) {
      orphans = kill_orphans(0);
      R.next_scan = now() + SCAN_S;
    }
  }
}
