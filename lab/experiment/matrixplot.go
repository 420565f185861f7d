package experiment

import (
	"fmt"
	"github.com/basin-dev/basin/sim/harness"
	"image/color"
	"io"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/basin-dev/basin/sim"
)

// policyStyle gives each policy the same colour and dash on every panel: baselines grey and
// dashed, basin's variants in colour.
func policyStyle(p string) (color.Color, []vg.Length) {
	switch p {
	case EnginePolicy:
		return color.RGBA{R: 120, G: 120, B: 120, A: 255}, []vg.Length{vg.Points(2), vg.Points(2)}
	case string(sim.PolicyContinuum):
		return color.RGBA{R: 30, G: 30, B: 30, A: 255}, []vg.Length{vg.Points(6), vg.Points(3)}
	case harness.BasinBlind:
		return color.RGBA{R: 230, G: 159, B: 0, A: 255}, nil
	case harness.Basin:
		return color.RGBA{R: 0, G: 114, B: 178, A: 255}, nil
	case harness.Oracle:
		return color.RGBA{R: 0, G: 158, B: 115, A: 255}, []vg.Length{vg.Points(1), vg.Points(2)}
	case harness.BasinCurrent:
		return color.RGBA{R: 204, G: 121, B: 167, A: 255}, nil
	}
	return color.Black, nil
}

// MatrixPlot draws goodput against load (median over seeds) per policy for one workload: one
// panel per deployment and tier (columns) and spike (rows), so the crossing points — where a
// policy leaves its plateau — line up across panels.
func MatrixPlot(w io.Writer, m *MatrixResult, workload string) error {
	spec := m.Spec
	type col struct {
		dep  string
		tier Tier
	}
	var cols []col
	for _, d := range spec.Deployments {
		for _, t := range spec.Tiers {
			cols = append(cols, col{d, t})
		}
	}
	var spikes []float64
	for _, r := range m.Rows {
		if !slices.Contains(spikes, r.Spike) {
			spikes = append(spikes, r.Spike)
		}
	}
	slices.Sort(spikes)
	grid := make([][]*plot.Plot, len(spikes))
	for i, sp := range spikes {
		grid[i] = make([]*plot.Plot, len(cols))
		for j, c := range cols {
			p := plot.New()
			g := MatrixGroup{Deployment: c.dep, Tier: c.tier, Workload: workload}
			tier := "GPU only"
			if c.tier == TierHost {
				tier = "host tier"
			}
			p.Title.Text = fmt.Sprintf("%s %s, spike %s", c.dep, tier, spikeLabel(sp))
			p.X.Label.Text = "load ÷ calibrated peak"
			p.Y.Label.Text = "goodput (sessions/h)"
			p.Y.Min = 0
			p.Add(plotter.NewGrid())
			p.Legend.Top = true
			p.Legend.Left = true
			for _, pol := range spec.Policies {
				var xys plotter.XYs
				for r, row := range m.Rows {
					if row.MatrixGroup != g || row.Spike != sp {
						continue
					}
					xys = append(xys, plotter.XY{X: row.Load, Y: medianOf(m.Cell(r, pol),
						func(r *sim.Result) *float64 { return &r.GoodputPerHour })})
				}
				if len(xys) == 0 {
					continue
				}
				l, pts, err := plotter.NewLinePoints(xys)
				if err != nil {
					return fmt.Errorf("plot %s %s: %w", g, pol, err)
				}
				clr, dash := policyStyle(pol)
				l.Color, l.Dashes, l.Width = clr, dash, vg.Points(1.5)
				pts.Color, pts.Shape, pts.Radius = clr, draw.CircleGlyph{}, vg.Points(2)
				p.Add(l, pts)
				if i == 0 && j == 0 {
					p.Legend.Add(PolicyLabel(TierGPU, pol)+map[bool]string{true: " / hicache", false: ""}[pol == EnginePolicy], l, pts)
				}
			}
			grid[i][j] = p
		}
	}
	width := vg.Length(len(cols)) * 4 * vg.Inch
	height := vg.Length(len(spikes)) * 3 * vg.Inch
	c := vgsvg.New(width, height)
	dc := draw.New(c)
	dc = draw.Crop(dc, 0, 0, 0, -0.3*vg.Inch)
	title := draw.New(c)
	title.FillText(draw.TextStyle{Color: color.Black, Font: font.From(plot.DefaultFont, 14), Handler: plot.DefaultTextHandler,
		XAlign: draw.XCenter, YAlign: draw.YTop}, vg.Point{X: width / 2, Y: height - 0.05*vg.Inch},
		fmt.Sprintf("%s: goodput against load, median over seeds %v", workload, spec.Seeds))
	return drawGrid(w, c, dc, grid)
}

// drawGrid lays the plots out on dc as a grid of tiles (rows × columns of grid) and writes the SVG
// canvas c they are drawn on: the matrix's and the scaling section's plots alike.
func drawGrid(w io.Writer, c *vgsvg.Canvas, dc draw.Canvas, grid [][]*plot.Plot) error {
	cols := 0
	if len(grid) > 0 {
		cols = len(grid[0])
	}
	tiles := draw.Tiles{Rows: len(grid), Cols: cols, PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 4,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align(grid, tiles, dc)
	for i := range grid {
		for j := range grid[i] {
			grid[i][j].Draw(canvases[i][j])
		}
	}
	if _, err := c.WriteTo(w); err != nil {
		return fmt.Errorf("write plot: %w", err)
	}
	return nil
}
