/*
 * held_disk: a FUSE file system with one file, "disk", that passes reads and writes through to a
 * backing file, except that a request touching byte HELD_OFFSET waits while HELD_CONTROL/hold
 * exists (HELD_CONTROL/held is created when one starts waiting); if HELD_CONTROL/drop exists when
 * it is let go, it fails with EIO without touching the file (its issuer is gone by then). The
 * tests use it to hold one request of a disk in the kernel while later ones complete: a real
 * request, really in flight. (FUSE serialises writes to a file opened for direct I/O, so the
 * requests that complete meanwhile are reads.) While HELD_CONTROL/one exists too, only one request
 * is held at a time: the others touching the byte pass. HELD_WRITE_DELAY_US, if set, makes every write
 * take that much longer: a slow disk, on which a writer always has requests in flight.
 *
 * Built by the tests (cc ... $(pkg-config --cflags --libs fuse3)); run as
 *   HELD_BACKING=file HELD_OFFSET=bytes HELD_CONTROL=dir held_disk MOUNTPOINT -f
 * The file is opened with direct_io, so every request reaches this program.
 */
#define FUSE_USE_VERSION 31
#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int backing = -1;
static off_t held_offset;
static useconds_t delay_us;
static char hold_path[4096];
static char held_path[4096];
static char drop_path[4096];
static char one_path[4096];
/* Requests waiting in maybe_hold. */
static int holding;
static char hold_open_path[4096];
static char opening_path[4096];

static int disk_getattr(const char *path, struct stat *st, struct fuse_file_info *fi)
{
    (void)fi;
    memset(st, 0, sizeof(*st));
    if (strcmp(path, "/") == 0) {
        st->st_mode = S_IFDIR | 0755;
        st->st_nlink = 2;
        return 0;
    }
    if (strcmp(path, "/disk") != 0)
        return -ENOENT;
    struct stat real;
    if (fstat(backing, &real) != 0)
        return -errno;
    st->st_mode = S_IFREG | 0644;
    st->st_nlink = 1;
    st->st_size = real.st_size;
    return 0;
}

static int disk_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t offset,
                        struct fuse_file_info *fi, enum fuse_readdir_flags flags)
{
    (void)offset, (void)fi, (void)flags;
    if (strcmp(path, "/") != 0)
        return -ENOENT;
    fill(buf, ".", NULL, 0, 0);
    fill(buf, "..", NULL, 0, 0);
    fill(buf, "disk", NULL, 0, 0);
    return 0;
}

static int disk_open(const char *path, struct fuse_file_info *fi)
{
    if (strcmp(path, "/disk") != 0)
        return -ENOENT;
    /* HELD_CONTROL/hold-open: opens wait while it exists (HELD_CONTROL/opening marks one). */
    if (access(hold_open_path, F_OK) == 0) {
        FILE *marker = fopen(opening_path, "w");
        if (marker)
            fclose(marker);
        while (access(hold_open_path, F_OK) == 0)
            usleep(10000);
    }
    fi->direct_io = 1;
    return 0;
}

/* Wait while the hold file exists, if [offset, offset + size) covers the held byte; -EIO if the
 * request is to be dropped then, else 0. */
static int maybe_hold(off_t offset, size_t size, const char *what)
{
    if (held_offset < offset || held_offset >= offset + (off_t)size)
        return 0;
    if (access(hold_path, F_OK) != 0)
        return 0;
    int none = 0;
    if (access(one_path, F_OK) == 0) {
        if (!__atomic_compare_exchange_n(&holding, &none, 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
            return 0;
    } else {
        __atomic_add_fetch(&holding, 1, __ATOMIC_SEQ_CST);
    }
    FILE *marker = fopen(held_path, "w");
    if (marker) {
        fprintf(marker, "%s %lld %zu\n", what, (long long)offset, size);
        fclose(marker);
    }
    while (access(hold_path, F_OK) == 0)
        usleep(10000);
    __atomic_sub_fetch(&holding, 1, __ATOMIC_SEQ_CST);
    return access(drop_path, F_OK) == 0 ? -EIO : 0;
}

static int disk_read(const char *path, char *buf, size_t size, off_t offset,
                     struct fuse_file_info *fi)
{
    (void)path, (void)fi;
    int dropped = maybe_hold(offset, size, "read");
    if (dropped)
        return dropped;
    ssize_t n = pread(backing, buf, size, offset);
    return n < 0 ? -errno : (int)n;
}

static int disk_write(const char *path, const char *buf, size_t size, off_t offset,
                      struct fuse_file_info *fi)
{
    (void)path, (void)fi;
    int dropped = maybe_hold(offset, size, "write");
    if (dropped)
        return dropped;
    if (delay_us)
        usleep(delay_us);
    ssize_t n = pwrite(backing, buf, size, offset);
    return n < 0 ? -errno : (int)n;
}

static int disk_fsync(const char *path, int datasync, struct fuse_file_info *fi)
{
    (void)path, (void)fi;
    return (datasync ? fdatasync(backing) : fsync(backing)) != 0 ? -errno : 0;
}

static int disk_flush(const char *path, struct fuse_file_info *fi)
{
    (void)path, (void)fi;
    return 0;
}

static const struct fuse_operations operations = {
    .getattr = disk_getattr,
    .readdir = disk_readdir,
    .open = disk_open,
    .read = disk_read,
    .write = disk_write,
    .fsync = disk_fsync,
    .flush = disk_flush,
};

int main(int argc, char *argv[])
{
    const char *file = getenv("HELD_BACKING");
    const char *offset = getenv("HELD_OFFSET");
    const char *control = getenv("HELD_CONTROL");
    if (!file || !offset || !control) {
        fprintf(stderr, "held_disk: set HELD_BACKING, HELD_OFFSET and HELD_CONTROL\n");
        return 2;
    }
    backing = open(file, O_RDWR);
    if (backing < 0) {
        perror(file);
        return 1;
    }
    held_offset = strtoll(offset, NULL, 0);
    const char *delay = getenv("HELD_WRITE_DELAY_US");
    delay_us = delay ? (useconds_t)strtoul(delay, NULL, 0) : 0;
    snprintf(hold_path, sizeof(hold_path), "%s/hold", control);
    snprintf(held_path, sizeof(held_path), "%s/held", control);
    snprintf(drop_path, sizeof(drop_path), "%s/drop", control);
    snprintf(one_path, sizeof(one_path), "%s/one", control);
    snprintf(hold_open_path, sizeof(hold_open_path), "%s/hold-open", control);
    snprintf(opening_path, sizeof(opening_path), "%s/opening", control);
    return fuse_main(argc, argv, &operations, NULL);
}
