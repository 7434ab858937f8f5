package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// The compass goal: a 1% change costs at most this share of a full backup.
const bkGoalPct = 5.0

// bkMethods is the order methods are shown in.
var bkMethods = []string{methodIncremental, methodStrataFull, methodEtcdFull}

// renderBK writes backup.md and the plots into dir and returns the files.
func renderBK(rep *bkReport, dir string) ([]string, error) {
	pngs, err := plotBK(rep, dir)
	md := filepath.Join(dir, "backup.md")
	if werr := os.WriteFile(md, []byte(markdownBK(rep, pngs)), 0o644); werr != nil {
		return pngs, werr
	}
	return append([]string{md}, pngs...), err
}

// mb formats bytes as MB (10^6).
func mb(b int64) string { return fmt.Sprintf("%.1f", float64(b)/1e6) }

// snapsOf returns the experiment's snapshots of step >= from, by step
// and method.
func snapsOf(rep *bkReport, exp string) (steps []int, by map[int]map[string]bkSnap) {
	by = map[int]map[string]bkSnap{}
	for _, s := range rep.Snapshots {
		if s.Experiment != exp {
			continue
		}
		if by[s.Step] == nil {
			by[s.Step] = map[string]bkSnap{}
			steps = append(steps, s.Step)
		}
		by[s.Step][s.Method] = s
	}
	sort.Ints(steps)
	return steps, by
}

// methodsIn returns the methods present in rep, in bkMethods order.
func methodsIn(rep *bkReport) []string {
	var ms []string
	for _, m := range bkMethods {
		if slices.ContainsFunc(rep.Snapshots, func(s bkSnap) bool { return s.Method == m }) {
			ms = append(ms, m)
		}
	}
	return ms
}

// cells joins one value per method with " / ".
func cells(ms []string, row map[string]bkSnap, f func(bkSnap) string) string {
	var parts []string
	for _, m := range ms {
		s, ok := row[m]
		switch {
		case !ok:
			parts = append(parts, "–")
		case s.Err != "":
			parts = append(parts, "failed")
		default:
			parts = append(parts, f(s))
		}
	}
	return strings.Join(parts, " / ")
}

func markdownBK(rep *bkReport, pngs []string) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	ms := methodsIn(rep)
	st := rep.Settings
	p("# Incremental backups against full snapshots (seed 004, Figures 4.18-4.19)\n\n")
	p("Command: `%s` (commit %s). Started %s, finished %s.\n\n", rep.Command, rep.Commit, rep.Started.Format("2006-01-02 15:04:05Z"),
		rep.Finished.Format("2006-01-02 15:04:05Z"))
	m := rep.Machine
	p("Machine: %d CPUs (%s), %s, kernel %s, disk %s, %s; load average at start %s, at end %s (each snapshot's is in backup.json).\n\n",
		m.NProc, m.CPUModel, m.Memory, m.Kernel, m.Disk, m.GoVersion, m.LoadStart, m.LoadEnd)
	for _, s := range rep.Servers {
		p("- %s: %s (`%s`)\n", s.Name, s.Version, s.Binary)
	}
	p("\nData: keys `user<20 digits>` (%d bytes), values of %d random bytes; ", st.KeySize, st.ValSize)
	if slices.Contains(st.Experiments, expGrow) {
		p("grow: %d steps of %d new keys; ", st.GrowSteps, st.GrowKeys)
	}
	if slices.Contains(st.Experiments, expUpdate) {
		p("update: %d steps each overwriting %.3g%% of the keys", st.UpdateSteps, st.UpdatePct)
		if !slices.Contains(st.Experiments, expGrow) {
			p(" of %d loaded in step 0", st.BaseKeys)
		} else {
			p(" grow left")
		}
		p(". ")
	}
	if len(ms) == 0 {
		ms = bkMethods[:1] // no snapshot yet: only the header line uses it
	}
	p("Methods, in every cell in this order: %s. Sizes in MB (10^6 bytes); the order the snapshots are taken in rotates from step to step. "+
		"The load average column is /proc/loadavg (1, 5, 15 min) just before the step's %s snapshot.\n\n", strings.Join(ms, " / "), ms[0])
	for _, n := range rep.Notes {
		p("> %s\n\n", n)
	}
	for _, exp := range []string{expGrow, expUpdate} {
		steps, by := snapsOf(rep, exp)
		if len(steps) == 0 {
			continue
		}
		if exp == expGrow {
			p("## Growing state (004, Figure 4.18)\n\n")
		} else {
			p("## Large state, small updates (004, Figure 4.19)\n\n")
		}
		p("| step | keys | written MB | snapshot s | snapshot MB | cumulative s | cumulative MB | whole snapshot MB | load avg |\n")
		p("|---|---|---|---|---|---|---|---|---|\n")
		for _, step := range steps {
			row := by[step]
			var first bkSnap
			for _, m := range slices.Backward(ms) {
				if s, ok := row[m]; ok {
					first = s // the first method present, in ms order
				}
			}
			label := fmt.Sprint(step)
			if step == 0 {
				label = "0 (base)"
			}
			p("| %s | %d | %s | %s | %s | %s | %s | %s | %s |\n", label, first.Keys, mb(first.WrittenBytes),
				cells(ms, row, func(s bkSnap) string { return fmt.Sprintf("%.2f", s.Seconds) }),
				cells(ms, row, func(s bkSnap) string { return mb(s.Bytes) }),
				cells(ms, row, func(s bkSnap) string { return fmt.Sprintf("%.2f", s.CumSeconds) }),
				cells(ms, row, func(s bkSnap) string { return mb(s.CumBytes) }),
				cells(ms, row, func(s bkSnap) string { return mb(s.FullBytes) }),
				first.LoadAvg)
		}
		shape(&b, ms, steps, by)
		var base *bkSnap // the version before the experiment's first step
		if gsteps, gby := snapsOf(rep, expGrow); exp == expUpdate && steps[0] > 0 && len(gsteps) > 0 {
			if s, ok := gby[gsteps[len(gsteps)-1]][methodIncremental]; ok && s.Err == "" {
				base = &s
			}
		}
		uploads(&b, steps, by, base)
		if exp == expUpdate {
			changeCost(&b, steps, by)
		}
		if f := pngNamed(pngs, "backup-"+exp+".png"); f != "" {
			p("\n![%s](%s)\n", exp, filepath.Base(f))
		}
		p("\n")
	}
	restores(&b, rep, pngs)
	loads(&b, rep)
	if len(rep.Commands) > 0 {
		p("## Commands\n\nThe first of each, with this run's ports and paths:\n\n")
		keys := make([]string, 0, len(rep.Commands))
		for k := range rep.Commands {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			p("- %s: `%s`\n", k, strings.Join(rep.Commands[k], " "))
		}
		for _, s := range rep.Servers {
			if len(s.Command) > 0 {
				p("- %s server: `%s`\n", s.Name, strings.Join(s.Command, " "))
			}
		}
	}
	return b.String()
}

// shape summarises how each method's cost grows: the first and last
// counted step's snapshot, and the cumulative total divided by steps x the
// first snapshot (1 when every snapshot costs the same, a linear total;
// (N+1)/2 when the snapshot grows in proportion to the step, a quadratic
// total).
func shape(b *strings.Builder, ms []string, steps []int, by map[int]map[string]bkSnap) {
	var counted []int
	for _, s := range steps {
		if s > 0 {
			counted = append(counted, s)
		}
	}
	if len(counted) < 2 {
		return
	}
	first, last := counted[0], counted[len(counted)-1]
	n := float64(len(counted))
	fmt.Fprintf(b, "\nShape over steps %d..%d: cumulative ÷ (steps × first snapshot) is 1 for a constant cost per snapshot (a linear total) and %.1f for a snapshot that grows in step with the state (a quadratic total).\n\n", first, last, (n+1)/2)
	b.WriteString("| method | snapshot MB, first → last | snapshot s, first → last | cumulative MB | cumulative s | MB: cum ÷ (steps × first) | s: cum ÷ (steps × first) |\n|---|---|---|---|---|---|---|\n")
	for _, m := range ms {
		f, okf := by[first][m]
		l, okl := by[last][m]
		if !okf || !okl || f.Err != "" || l.Err != "" {
			continue
		}
		ratio := func(cum, one float64) string {
			if one <= 0 {
				return "–"
			}
			return fmt.Sprintf("%.2f", cum/(n*one))
		}
		fmt.Fprintf(b, "| %s | %s → %s | %.2f → %.2f | %s | %.2f | %s | %s |\n", m, mb(f.Bytes), mb(l.Bytes), f.Seconds, l.Seconds,
			mb(l.CumBytes), l.CumSeconds, ratio(float64(l.CumBytes), float64(f.Bytes)), ratio(l.CumSeconds, f.Seconds))
	}
}

// uploads splits what each incremental version uploaded into what the
// version grew by and the rest: uploaded - growth is the size of the tables
// the previous version named and this one does not (Pebble's compactions
// rewrote them between the two; a flush only adds tables). base, if not
// nil, is the version before steps[0] (update after grow).
func uploads(b *strings.Builder, steps []int, by map[int]map[string]bkSnap, base *bkSnap) {
	prev := base
	var rows []string
	for _, step := range steps {
		inc, ok := by[step][methodIncremental]
		if !ok || inc.Err != "" {
			prev = nil
			continue
		}
		// A log version uploads log objects, not files: it has no row.
		if prev != nil && step > 0 && inc.Kind != "log" {
			growth := inc.FullBytes - prev.FullBytes
			rows = append(rows, fmt.Sprintf("| %d | %s | %d | %s | %s |", step, mb(inc.NewBytes), inc.NewFiles, mb(growth), mb(inc.NewBytes-growth)))
		}
		prev = &inc
	}
	if len(rows) == 0 {
		return
	}
	b.WriteString("\nWhat each incremental files version uploaded: the version's growth over the previous one, and the rest (uploaded − growth), " +
		"the size of the files the previous version named and this one does not (tables that compactions rewrote between the two; a flush only adds tables). " +
		"Log versions have no row.\n\n")
	b.WriteString("| step | uploaded MB | new files | version growth MB | uploaded − growth MB |\n|---|---|---|---|---|\n")
	b.WriteString(strings.Join(rows, "\n") + "\n")
}

// changeCost is the update experiment's table: what each step's change cost
// the incremental backup, as a share of a full backup.
func changeCost(b *strings.Builder, steps []int, by map[int]map[string]bkSnap) {
	fmt.Fprintf(b, "\nWhat each step's change cost the incremental backup (its new bytes in the target), as a share of a full backup: "+
		"a files version of the same state (the version's whole size, or for a log version its checkpoint's bytes: a full backup in the same format), "+
		"strata's `etcdctl snapshot save` file, etcd's. Kind: the version's (a log version names its files version, the base, and the raft log after it; "+
		"replayed: the log a restore replays on the base). Compass goal: at most %.0f%%.\n\n", bkGoalPct)
	b.WriteString("| step | keys changed MB | kind | incremental MB | new files or log objects | replayed MB | % of a full version | % of strata's full snapshot | % of etcd's full snapshot | goal met |\n|---|---|---|---|---|---|---|---|---|---|\n")
	prevWritten := int64(0)
	for _, step := range steps {
		row := by[step]
		inc, ok := row[methodIncremental]
		if step == 0 || !ok || inc.Err != "" {
			continue
		}
		share := func(m string) (string, float64) {
			s, ok := row[m]
			if m == methodIncremental {
				s = inc
			}
			if !ok || s.Err != "" || s.FullBytes <= 0 {
				return "–", -1
			}
			v := 100 * float64(inc.Bytes) / float64(s.FullBytes)
			return fmt.Sprintf("%.1f", v), v
		}
		own, v := share(methodIncremental)
		sf, _ := share(methodStrataFull)
		ef, _ := share(methodEtcdFull)
		met := "yes"
		if v > bkGoalPct {
			met = "no"
		}
		kind, replayed := inc.Kind, "–"
		if kind == "" {
			kind = "files" // a run before log versions
		}
		if inc.Kind == "log" {
			replayed = mb(inc.LogBytes)
			kind = fmt.Sprintf("log on %d", inc.Base)
		}
		fmt.Fprintf(b, "| %d | %s | %s | %s | %d | %s | %s | %s | %s | %s |\n", step, mb(inc.WrittenBytes-prevWritten), kind, mb(inc.Bytes), inc.NewFiles,
			replayed, own, sf, ef, met)
		prevWritten = inc.WrittenBytes
	}
}

func restores(b *strings.Builder, rep *bkReport, pngs []string) {
	if len(rep.Restores) == 0 {
		return
	}
	b.WriteString("## Restore time by state size\n\n")
	b.WriteString("Restore: the command's wall time into a new data dir. Start: a server started on that data dir, exec until a linearizable read answers (the restored key count is then checked).\n\n")
	b.WriteString("Experiment update-files is a files version of the last update step's state, taken after its log version (`--kind files`) and restored for comparison.\n\n")
	b.WriteString("| experiment | step | keys | live MB | method | version | snapshot MB | restore s | start s | restore + start s | restored data dir MB | load avg |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	rs := slices.Clone(rep.Restores)
	sort.SliceStable(rs, func(i, j int) bool {
		if rs[i].Experiment != rs[j].Experiment {
			return rs[i].Experiment < rs[j].Experiment
		}
		if rs[i].Step != rs[j].Step {
			return rs[i].Step < rs[j].Step
		}
		return slices.Index(bkMethods, rs[i].Method) < slices.Index(bkMethods, rs[j].Method)
	})
	// The kind of each incremental snapshot restored, by experiment and
	// step.
	kinds := map[string]string{}
	for _, s := range rep.Snapshots {
		if s.Method == methodIncremental && s.Kind != "" {
			kinds[fmt.Sprint(s.Experiment, s.Step)] = s.Kind
			if s.Kind == "log" {
				kinds[fmt.Sprint(s.Experiment, s.Step)] = fmt.Sprintf("log on %d (replays %s MB)", s.Base, mb(s.LogBytes))
			}
		}
	}
	if f := rep.FilesAfterUpdate; f != nil {
		kinds[fmt.Sprint(expUpdate+"-files", f.Step)] = "files"
	}
	for _, r := range rs {
		kind := "–"
		if r.Method == methodIncremental {
			kind = kinds[fmt.Sprint(r.Experiment, r.Step)]
		}
		if r.Err != "" {
			fmt.Fprintf(b, "| %s | %d | %d | %s | %s | %s | %s | failed: %s | | | | %s |\n", r.Experiment, r.Step, r.Keys, mb(r.LiveBytes), r.Method, kind,
				mb(r.SnapshotBytes), r.Err, r.LoadAvg)
			continue
		}
		fmt.Fprintf(b, "| %s | %d | %d | %s | %s | %s | %s | %.2f | %.2f | %.2f | %s | %s |\n", r.Experiment, r.Step, r.Keys, mb(r.LiveBytes), r.Method, kind,
			mb(r.SnapshotBytes), r.Seconds, r.StartSeconds, r.Seconds+r.StartSeconds, mb(r.DataDirBytes), r.LoadAvg)
	}
	if f := pngNamed(pngs, "backup-restore.png"); f != "" {
		fmt.Fprintf(b, "\n![restore](%s)\n", filepath.Base(f))
	}
	b.WriteString("\n")
}

func loads(b *strings.Builder, rep *bkReport) {
	if len(rep.Loads) == 0 {
		return
	}
	b.WriteString("## Writes\n\nEach step's writes into each server (transactions of 100 puts, 16 in flight), and the server's data dir (with strata's raft log) after the step's snapshots.\n\n")
	b.WriteString("| experiment | step | server | keys | s | MB/s | data dir MB |\n|---|---|---|---|---|---|---|\n")
	per := int64(rep.Settings.KeySize + rep.Settings.ValSize)
	for _, l := range rep.Loads {
		if l.Err != "" {
			fmt.Fprintf(b, "| %s | %d | %s | %d | failed: %s | | |\n", l.Experiment, l.Step, l.Server, l.Keys, l.Err)
			continue
		}
		fmt.Fprintf(b, "| %s | %d | %s | %d | %.1f | %.1f | %s |\n", l.Experiment, l.Step, l.Server, l.Keys, l.Seconds,
			float64(l.Keys*per)/1e6/max(l.Seconds, 1e-9), mb(l.DataDirBytes))
	}
	b.WriteString("\n")
}

func pngNamed(pngs []string, name string) string {
	for _, f := range pngs {
		if filepath.Base(f) == name {
			return f
		}
	}
	return ""
}

// plotBK draws backup-grow.png and backup-update.png (per snapshot and
// cumulative, time and bytes, against the volume written: 004's Figures
// 4.18-4.19) and backup-restore.png.
func plotBK(rep *bkReport, dir string) ([]string, error) {
	var files []string
	ms := methodsIn(rep)
	for _, exp := range []string{expGrow, expUpdate} {
		steps, by := snapsOf(rep, exp)
		var counted []int
		for _, s := range steps {
			if s > 0 {
				counted = append(counted, s)
			}
		}
		if len(counted) == 0 {
			continue
		}
		panels := []struct {
			title, y string
			f        func(bkSnap) float64
		}{
			{"time per snapshot", "s", func(s bkSnap) float64 { return s.Seconds }},
			{"cumulative time", "s", func(s bkSnap) float64 { return s.CumSeconds }},
			{"bytes per snapshot", "MB", func(s bkSnap) float64 { return float64(s.Bytes) / 1e6 }},
			{"cumulative bytes", "MB", func(s bkSnap) float64 { return float64(s.CumBytes) / 1e6 }},
		}
		grid := [][]*plot.Plot{make([]*plot.Plot, 2), make([]*plot.Plot, 2)}
		for i, pn := range panels {
			p := plot.New()
			p.Title.Text = pn.title
			p.X.Label.Text = "MB written"
			p.Y.Label.Text = pn.y
			var lines []any
			for _, m := range ms {
				var xys plotter.XYs
				for _, step := range counted {
					if s, ok := by[step][m]; ok && s.Err == "" {
						xys = append(xys, plotter.XY{X: float64(s.WrittenBytes) / 1e6, Y: pn.f(s)})
					}
				}
				if len(xys) > 0 {
					lines = append(lines, m, xys)
				}
			}
			if err := plotutil.AddLinePoints(p, lines...); err != nil {
				return files, fmt.Errorf("plot %s %s: %w", exp, pn.title, err)
			}
			p.Legend.Top, p.Legend.Left = true, true
			p.X.Min, p.Y.Min = 0, 0
			grid[i/2][i%2] = p
		}
		title := "growing state (004 Fig. 4.18)"
		if exp == expUpdate {
			title = fmt.Sprintf("large state, %.3g%% of keys updated per step (004 Fig. 4.19)", rep.Settings.UpdatePct)
		}
		f := filepath.Join(dir, "backup-"+exp+".png")
		if err := saveGrid(grid, title, f); err != nil {
			return files, err
		}
		files = append(files, f)
	}
	if len(rep.Restores) > 0 {
		grid := [][]*plot.Plot{make([]*plot.Plot, 2)}
		for i, pn := range []struct {
			title string
			f     func(bkRestore) float64
		}{
			{"restore command", func(r bkRestore) float64 { return r.Seconds }},
			{"restore + start until a read answers", func(r bkRestore) float64 { return r.Seconds + r.StartSeconds }},
		} {
			p := plot.New()
			p.Title.Text = pn.title
			p.X.Label.Text = "live data MB (keys + values)"
			p.Y.Label.Text = "s"
			var lines []any
			for _, m := range ms {
				var xys plotter.XYs
				for _, r := range rep.Restores {
					// By state size: the growing state's restores only.
					if r.Method == m && r.Err == "" && r.Experiment == expGrow {
						xys = append(xys, plotter.XY{X: float64(r.LiveBytes) / 1e6, Y: pn.f(r)})
					}
				}
				if len(xys) > 0 {
					lines = append(lines, m, xys)
				}
			}
			if err := plotutil.AddLinePoints(p, lines...); err != nil {
				return files, fmt.Errorf("plot restore: %w", err)
			}
			p.Legend.Top, p.Legend.Left = true, true
			p.X.Min, p.Y.Min = 0, 0
			grid[0][i] = p
		}
		f := filepath.Join(dir, "backup-restore.png")
		if err := saveGrid(grid, "restore time by state size", f); err != nil {
			return files, err
		}
		files = append(files, f)
	}
	return files, nil
}

// saveGrid draws the plots in a grid under a title into a PNG.
func saveGrid(grid [][]*plot.Plot, title, path string) error {
	rows, cols := len(grid), len(grid[0])
	w, h := vg.Length(cols)*5.5*vg.Inch, vg.Length(rows)*3.8*vg.Inch+0.4*vg.Inch
	img := vgimg.New(w, h)
	dc := draw.New(img)
	head := plot.New()
	head.Title.Text = title
	head.HideAxes()
	head.Draw(draw.Crop(dc, 0, 0, h-0.4*vg.Inch, 0))
	top := draw.Crop(dc, 0, 0, 0, -0.4*vg.Inch)
	t := draw.Tiles{Rows: rows, Cols: cols, PadX: 0.3 * vg.Inch, PadY: 0.3 * vg.Inch, PadTop: 0.1 * vg.Inch, PadBottom: 0.1 * vg.Inch,
		PadLeft: 0.1 * vg.Inch, PadRight: 0.2 * vg.Inch}
	canvases := plot.Align(grid, t, top)
	for j := range grid {
		for i := range grid[j] {
			if grid[j][i] != nil {
				grid[j][i].Draw(canvases[j][i])
			}
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("save %s: %w", path, err)
	}
	return f.Close()
}
