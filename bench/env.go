package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/strata-kv/strata/bench/internal/report"
)

// rootModule is the module path that marks strata's repository root.
const rootModule = "github.com/strata-kv/strata"

// findRepo walks up from dir to the directory whose go.mod declares
// rootModule.
func findRepo(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("find repository: %w", err)
	}
	for d := dir; ; d = filepath.Dir(d) {
		b, err := os.ReadFile(filepath.Join(d, "go.mod"))
		if err == nil && modulePath(b) == rootModule {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("find repository: no go.mod of %s above %s (use -repo)", rootModule, dir)
		}
	}
}

// modulePath returns the module line of a go.mod file.
func modulePath(gomod []byte) string {
	sc := bufio.NewScanner(bytes.NewReader(gomod))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "module "); ok {
			return strings.Trim(strings.TrimSpace(rest), `"`)
		}
	}
	return ""
}

// buildTimeout bounds one go build; a cold build of etcd takes a few
// minutes on a small shared machine.
const buildTimeout = 15 * time.Minute

// goBuild runs `go build -C dir -o out pkgs...`.
func goBuild(ctx context.Context, dir, out string, pkgs ...string) error {
	ctx, cancel := context.WithTimeout(ctx, buildTimeout)
	defer cancel()
	args := append([]string{"build", "-C", dir, "-o", out}, pkgs...)
	cmd := exec.CommandContext(ctx, "go", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// buildEtcd builds real etcd and etcdctl from the tools module into binDir
// and returns the etcd binary's path.
func buildEtcd(ctx context.Context, repo, binDir string) (string, error) {
	if err := goBuild(ctx, filepath.Join(repo, "tools"), binDir+string(filepath.Separator), "./cmd/etcd", "./cmd/etcdctl"); err != nil {
		return "", fmt.Errorf("build etcd: %w", err)
	}
	return filepath.Join(binDir, "etcd"), nil
}

// buildEtcdTools builds etcd, etcdctl and etcdutl from the tools module
// into binDir.
func buildEtcdTools(ctx context.Context, repo, binDir string) error {
	if err := goBuild(ctx, filepath.Join(repo, "tools"), binDir+string(filepath.Separator), "./cmd/etcd", "./cmd/etcdctl", "./cmd/etcdutl"); err != nil {
		return fmt.Errorf("build etcd tools: %w", err)
	}
	return nil
}

// buildStrata builds cmd/strata into binDir and returns its path.
func buildStrata(ctx context.Context, repo, binDir string) (string, error) {
	out := filepath.Join(binDir, "strata")
	if err := goBuild(ctx, repo, out, "./cmd/strata"); err != nil {
		return "", fmt.Errorf("build strata: %w", err)
	}
	return out, nil
}

// binaryVersion runs `bin --version` and returns its first line (etcd's
// "etcd Version: ..."), or strata's own line where there is one (strata's
// first line is the etcd API version it implements), or a note saying why
// there is none.
func binaryVersion(ctx context.Context, bin string) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--version").CombinedOutput()
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if err != nil || lines[0] == "" {
		return "no --version"
	}
	for _, l := range lines {
		if strings.HasPrefix(l, "strata Version: ") {
			return l
		}
	}
	return lines[0]
}

// gitHead returns the short commit of repo, with "+dirty" if the work tree
// has changes, or "" when git cannot tell.
func gitHead(ctx context.Context, repo string) string {
	out, err := exec.CommandContext(ctx, "git", "-C", repo, "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return ""
	}
	head := strings.TrimSpace(string(out))
	st, err := exec.CommandContext(ctx, "git", "-C", repo, "status", "--porcelain", "--untracked-files=no").Output()
	if err == nil && len(bytes.TrimSpace(st)) > 0 {
		head += "+dirty"
	}
	return head
}

// machineInfo describes the host, with the disk that holds workDir.
func machineInfo(workDir string) report.Machine {
	m := report.Machine{NProc: runtime.NumCPU(), GoVersion: runtime.Version(), CPUModel: "unknown", Kernel: "unknown"}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		if kb, err := meminfoKB(b, "MemTotal"); err == nil {
			m.Memory = fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
		}
	}
	m.Disk = diskInfo(workDir)
	m.LoadStart = loadAvg()
	return m
}

// meminfoKB returns a "Key: N kB" value of /proc/meminfo.
func meminfoKB(b []byte, key string) (int64, error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || k != key {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			break
		}
		return strconv.ParseInt(f[0], 10, 64)
	}
	return 0, fmt.Errorf("meminfo: no %s", key)
}

// loadAvg returns the first three fields of /proc/loadavg, or "unknown".
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// loadAvg1 returns the 1-minute load average of /proc/loadavg, or 0.
func loadAvg1() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 0
	}
	return v
}

// diskInfo names the file system and block device under path, and whether
// the device is rotational, as far as /proc and /sys tell.
func diskInfo(path string) string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "unknown"
	}
	abs, _ := filepath.Abs(path)
	var mnt, fstype, source string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		// Fields: id parent major:minor root mountpoint opts... - fstype source superopts
		f := strings.Fields(sc.Text())
		sep := -1
		for i, x := range f {
			if x == "-" {
				sep = i
				break
			}
		}
		if len(f) < 5 || sep < 0 || sep+2 >= len(f) {
			continue
		}
		mp := f[4]
		if (abs == mp || strings.HasPrefix(abs, strings.TrimSuffix(mp, "/")+"/")) && len(mp) >= len(mnt) {
			mnt, fstype, source = mp, f[sep+1], f[sep+2]
		}
	}
	if mnt == "" {
		return "unknown"
	}
	desc := fmt.Sprintf("%s on %s (%s)", source, mnt, fstype)
	dev := strings.TrimPrefix(source, "/dev/")
	if dev == source {
		return desc
	}
	// A partition's queue lives on its parent device.
	sys := filepath.Join("/sys/class/block", dev)
	if _, err := os.Stat(filepath.Join(sys, "partition")); err == nil {
		if parent, err := filepath.EvalSymlinks(filepath.Join(sys, "..")); err == nil {
			sys = parent
		}
	}
	if r, err := os.ReadFile(filepath.Join(sys, "queue", "rotational")); err == nil {
		if strings.TrimSpace(string(r)) == "0" {
			desc += ", kernel flags it non-rotational"
		} else {
			desc += ", kernel flags it rotational (virtio disks often are, whatever backs them)"
		}
	}
	if mdl, err := os.ReadFile(filepath.Join(sys, "device", "model")); err == nil && len(bytes.TrimSpace(mdl)) > 0 {
		desc += ", model " + strings.TrimSpace(string(mdl))
	}
	if strings.HasPrefix(dev, "vd") {
		desc += ", virtio virtual disk"
	}
	return desc
}

// tmpfsMagic is TMPFS_MAGIC from statfs(2).
const tmpfsMagic = 0x01021994

// onTmpfs reports whether dir is on tmpfs, where fsync costs nothing and a
// durability benchmark means little.
func onTmpfs(dir string) (bool, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return false, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return st.Type == tmpfsMagic, nil
}

// errNoStrata marks a strata binary that could not be built or found.
var errNoStrata = errors.New("strata binary unavailable")
