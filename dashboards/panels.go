package dashboards

import (
	"errors"
	"fmt"
	"strings"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/statetimeline"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
)

// Grafana macros and the dashboards' variables, as they appear in queries.
const (
	rateInterval = "$__rate_interval"
	jobMatch     = `job=~"$job"`
	instMatch    = `instance=~"$instance"`
	poolMatch    = `engine_type=~"$pool"`
)

// sel renders a series selector.
func sel(metric string, matchers ...string) string {
	return metric + "{" + strings.Join(matchers, ", ") + "}"
}

// rate is a per-second rate over Grafana's rate interval (at least four scrape intervals).
func rate(selector string) string { return "rate(" + selector + "[" + rateInterval + "])" }

// quantile is the q-quantile of a histogram family's bucket rates, kept apart by the by labels.
func quantile(q, family string, by string, matchers ...string) string {
	grouping := "le"
	if by != "" {
		grouping = by + ", le"
	}
	return fmt.Sprintf("histogram_quantile(%s, sum by (%s) (%s))", q, grouping, rate(sel(family+"_bucket", matchers...)))
}

// perInstance sums an SGLang scheduler gauge per instance. Series that differ only in tp_rank,
// pp_rank or moe_ep_rank are one value reported by several ranks (with
// --enable-metrics-for-all-schedulers) and are counted once; dp_rank series have their own
// pools and are added up — as basin's collector does.
func perInstance(selector string) string {
	return "sum by (instance) (max without (tp_rank, pp_rank, moe_ep_rank) (" + selector + "))"
}

// target is one query of a panel.
type target struct {
	expr, legend string
}

func datasource() common.DataSourceRef {
	return common.DataSourceRef{Type: cog.ToPtr("prometheus"), Uid: cog.ToPtr("${datasource}")}
}

func query(i int, t target) *prometheus.DataqueryBuilder {
	return prometheus.NewDataqueryBuilder().
		RefId(string(rune('A' + i))).
		Datasource(datasource()).
		Expr(t.expr).
		LegendFormat(t.legend).
		Range()
}

func legend() *common.VizLegendOptionsBuilder {
	return common.NewVizLegendOptionsBuilder().
		ShowLegend(true).
		DisplayMode(common.LegendDisplayModeList).
		Placement(common.LegendPlacementBottom)
}

func tooltip() *common.VizTooltipOptionsBuilder {
	return common.NewVizTooltipOptionsBuilder().Mode(common.TooltipDisplayModeMulti).Sort(common.SortOrderDescending)
}

// timeSeries is a line chart with a legend, a shared tooltip and one query per target.
func timeSeries(title, description, unit string, span uint32, targets ...target) *timeseries.PanelBuilder {
	p := timeseries.NewPanelBuilder().
		Title(title).
		Description(description).
		Datasource(datasource()).
		Unit(unit).
		Height(8).
		Span(span).
		Legend(legend()).
		Tooltip(tooltip()).
		LineWidth(1).
		FillOpacity(0).
		ShowPoints(common.VisibilityModeNever)
	for i, t := range targets {
		p.WithTarget(query(i, t))
	}
	return p
}

// stateTimeline shows one row per series, coloured by value mappings.
func stateTimeline(title, description string, height uint32, mappings []dashboard.ValueMapping, targets ...target) *statetimeline.PanelBuilder {
	p := statetimeline.NewPanelBuilder().
		Title(title).
		Description(description).
		Datasource(datasource()).
		Unit("short").
		Height(height).
		Span(24).
		Legend(legend()).
		Tooltip(tooltip()).
		Mappings(mappings).
		ShowValue(common.VisibilityModeAuto).
		MergeValues(true).
		FillOpacity(80).
		LineWidth(0)
	for i, t := range targets {
		p.WithTarget(query(i, t))
	}
	return p
}

// valueText is a value mapping: a number shown as text in a colour.
type valueText struct {
	value, text, color string
}

func valueMappings(vs ...valueText) []dashboard.ValueMapping {
	m := dashboard.ValueMap{Type: dashboard.MappingTypeValueToText, Options: map[string]dashboard.ValueMappingResult{}}
	for i, v := range vs {
		m.Options[v.value] = dashboard.ValueMappingResult{Text: cog.ToPtr(v.text), Color: cog.ToPtr(v.color), Index: cog.ToPtr(int32(i))}
	}
	return []dashboard.ValueMapping{{ValueMap: &m}}
}

// Override properties.
func unitProp(unit string) dashboard.DynamicConfigValue {
	return dashboard.DynamicConfigValue{Id: "unit", Value: unit}
}

func rightAxis(label string) []dashboard.DynamicConfigValue {
	return []dashboard.DynamicConfigValue{
		{Id: "custom.axisPlacement", Value: common.AxisPlacementRight},
		{Id: "custom.axisLabel", Value: label},
	}
}

func dashed() dashboard.DynamicConfigValue {
	return dashboard.DynamicConfigValue{Id: "custom.lineStyle", Value: common.LineStyle{
		Fill: cog.ToPtr(common.LineStyleFillDash), Dash: []float64{10, 10}}}
}

func fixedColor(color string) dashboard.DynamicConfigValue {
	return dashboard.DynamicConfigValue{Id: "color", Value: dashboard.FieldColor{
		Mode: dashboard.FieldColorModeIdFixed, FixedColor: cog.ToPtr(color)}}
}

func props(ps ...dashboard.DynamicConfigValue) []dashboard.DynamicConfigValue { return ps }

// board lays panels out and numbers them: every panel and row gets the next id, so ids are
// stable across regenerations and unique within the dashboard. Panels fill the 24-column grid
// left to right and wrap below the tallest panel of the line; a row starts a new line, full width
// (the placement of the SDK's v1 dashboard builder, which is deprecated with its Dashboard type).
type board struct {
	d    Dashboard
	next uint32
	errs []error
	// x and y are where the next panel goes; lineHeight is the tallest panel of the current line.
	x, y, lineHeight uint32
}

// gridWidth is the width of Grafana's dashboard grid, in columns.
const gridWidth = 24

func newBoard(uid, title, description string, tags []string) *board {
	b := &board{d: Dashboard{
		Uid:           uid,
		Title:         title,
		Description:   description,
		Tags:          tags,
		Timezone:      common.TimeZoneBrowser,
		Editable:      true,
		GraphTooltip:  dashboard.DashboardCursorSyncCrosshair,
		Time:          dashboard.DashboardDashboardTime{From: "now-6h", To: "now"},
		Refresh:       "30s",
		SchemaVersion: SchemaVersion,
	}}
	b.link(dashboard.NewDashboardLinkBuilder("basin").
		Type(dashboard.DashboardLinkTypeDashboards).
		Tags([]string{"basin"}).
		AsDropdown(false).
		IncludeVars(true).
		KeepTime(true))
	b.variable(dashboard.NewDatasourceVariableBuilder("datasource").
		Label("Data source").
		Type("prometheus"))
	return b
}

func (b *board) id() uint32 {
	b.next++
	return b.next
}

// add builds v and appends it to *to, or records the build error for build to return.
func add[T any](b *board, to *[]T, v cog.Builder[T]) {
	built, err := v.Build()
	if err != nil {
		b.errs = append(b.errs, err)
		return
	}
	*to = append(*to, built)
}

func (b *board) link(l cog.Builder[dashboard.DashboardLink]) { add(b, &b.d.Links, l) }

func (b *board) variable(v cog.Builder[dashboard.VariableModel]) { add(b, &b.d.Templating.List, v) }

func (b *board) annotation(a cog.Builder[dashboard.AnnotationQuery]) {
	add(b, &b.d.Annotations.List, a)
}

// row starts a new line with a full-width row header.
func (b *board) row(title string) {
	r, err := dashboard.NewRowBuilder(title).Id(b.id()).Build()
	if err != nil {
		b.errs = append(b.errs, err)
		return
	}
	r.GridPos = &dashboard.GridPos{X: 0, Y: b.y + b.lineHeight, W: gridWidth, H: 1}
	b.d.Panels = append(b.d.Panels, dashboard.PanelOrRowPanel{RowPanel: &r})
	b.x, b.y, b.lineHeight = 0, r.GridPos.Y+1, 0
}

// panel places a panel at the next free spot of the current line, wrapping when the line is full.
func (b *board) panel(p cog.Builder[dashboard.Panel]) {
	built, err := p.Build()
	if err != nil {
		b.errs = append(b.errs, err)
		return
	}
	built.Id = cog.ToPtr(b.id())
	if built.GridPos == nil {
		built.GridPos = dashboard.NewGridPos()
	}
	if built.GridPos.X == 0 && built.GridPos.Y == 0 {
		built.GridPos.X, built.GridPos.Y = b.x, b.y
	}
	b.d.Panels = append(b.d.Panels, dashboard.PanelOrRowPanel{Panel: &built})
	b.x += built.GridPos.W
	b.lineHeight = max(b.lineHeight, built.GridPos.H)
	if b.x >= gridWidth {
		b.x, b.y, b.lineHeight = 0, b.y+b.lineHeight, 0
	}
}

func (b *board) build() (Dashboard, error) {
	if err := errors.Join(append(b.errs, b.d.Validate())...); err != nil {
		return Dashboard{}, fmt.Errorf("build dashboard %s: %w", b.d.Uid, err)
	}
	return b.d, nil
}

// allOption selects "All" by default.
func allOption() dashboard.VariableOption {
	return dashboard.VariableOption{
		Selected: cog.ToPtr(true),
		Text:     dashboard.StringOrArrayOfString{ArrayOfString: []string{"All"}},
		Value:    dashboard.StringOrArrayOfString{ArrayOfString: []string{"$__all"}},
	}
}

// labelVariable is a multi-value query variable over label_values(selector, label), "All"
// (any value, the label absent included) by default.
func labelVariable(name, label, selector, description string) *dashboard.QueryVariableBuilder {
	q := fmt.Sprintf("label_values(%s, %s)", selector, label)
	return dashboard.NewQueryVariableBuilder(name).
		Label(strings.ToUpper(name[:1]) + name[1:]).
		Description(description).
		Datasource(datasource()).
		Query(dashboard.StringOrMap{String: cog.ToPtr(q)}).
		Definition(q).
		Refresh(dashboard.VariableRefreshOnTimeRangeChanged).
		Sort(dashboard.VariableSortAlphabeticalAsc).
		Multi(true).
		IncludeAll(true).
		AllValue(".*").
		Current(allOption())
}

// annotation is a Prometheus annotation: one event per run of samples of expr. The expression is
// set both as the query target (current Grafana) and at the top level (older Grafana reads it
// there).
func annotation(name, color, expr, title, tags string) *dashboard.AnnotationQueryBuilder {
	return dashboard.NewAnnotationQueryBuilder().
		Name(name).
		Datasource(datasource()).
		Enable(true).
		Hide(false).
		IconColor(color).
		Target(prometheus.NewDataqueryBuilder().RefId("Anno").Datasource(datasource()).Expr(expr).Range()).
		Expr(expr).
		TitleFormat(title).
		TagKeys(tags).
		Step("1m").
		UseValueForTime(false)
}
