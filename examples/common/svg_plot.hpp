// A small SVG line-plot writer: axes with round-numbered ticks, a legend, solid or dashed lines.
// Enough for the examples' figures (slot_sim, carve_replay) without a plotting library.
#pragma once

#include <fmt/format.h>
#include <fmt/os.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace carve::svg {

struct PlotLine {
  std::string label;
  std::vector<double> x, y;
  std::string color;
  bool dashed = false;
};

struct Plot {
  std::string title;
  std::vector<std::string> subtitle; // one line each
  std::string x_label, y_label;
  std::vector<PlotLine> lines;
  bool zero_line = false; // a horizontal rule at y = 0
  bool y_from_zero = true;
};

inline const std::vector<std::string>& palette() {
  static const std::vector<std::string> p = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                             "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  return p;
}

namespace detail {

inline std::string escape(const std::string& s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
    case '<':
      out += "&lt;";
      break;
    case '>':
      out += "&gt;";
      break;
    case '&':
      out += "&amp;";
      break;
    default:
      out += c;
    }
  }
  return out;
}

// About `target` ticks at 1, 2 or 5 times a power of ten.
inline std::vector<double> ticks(double lo, double hi, int target = 6) {
  if (!(hi > lo)) {
    hi = lo + 1;
  }
  const double raw = (hi - lo) / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double step = raw / mag < 1.5 ? mag : raw / mag < 3.5 ? 2 * mag : raw / mag < 7.5 ? 5 * mag : 10 * mag;
  std::vector<double> t;
  for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) {
    t.push_back(std::abs(v) < step * 1e-9 ? 0.0 : v);
  }
  return t;
}

inline std::string number(double v) {
  if (std::abs(v) >= 10000) {
    return fmt::format("{:.0f}", v);
  }
  return fmt::format("{:g}", v);
}

} // namespace detail

inline void write_svg(const Plot& plot, const std::string& path, int width = 860, int height = 520) {
  // The legend sits right of the plot: room for the longest label (about 7 px a character).
  std::size_t longest = 0;
  for (const PlotLine& l : plot.lines) {
    longest = std::max(longest, l.label.size());
  }
  const double left = 80, bottom = 60;
  const double right = std::max(210.0, 60.0 + 7.0 * static_cast<double>(longest));
  const double top = 40 + 16.0 * static_cast<double>(plot.subtitle.size());
  const double pw = width - left - right, ph = height - top - bottom;
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  for (const PlotLine& l : plot.lines) {
    for (std::size_t k = 0; k < l.x.size(); ++k) {
      if (std::isfinite(l.y[k])) {
        x0 = std::min(x0, l.x[k]);
        x1 = std::max(x1, l.x[k]);
        y0 = std::min(y0, l.y[k]);
        y1 = std::max(y1, l.y[k]);
      }
    }
  }
  if (!std::isfinite(x0)) {
    x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  }
  if (plot.y_from_zero) {
    y0 = std::min(y0, 0.0);
  }
  if (plot.zero_line) {
    y0 = std::min(y0, 0.0);
    y1 = std::max(y1, 0.0);
  }
  const auto yt = detail::ticks(y0, y1);
  const auto xt = detail::ticks(x0, x1);
  y0 = std::min(y0, yt.front());
  y1 = std::max(y1, yt.back());
  x1 = std::max(x1, xt.back());
  const auto sx = [&](double x) { return left + (x - x0) / (x1 - x0) * pw; };
  const auto sy = [&](double y) { return top + ph - (y - y0) / (y1 - y0) * ph; };

  auto f = fmt::output_file(path);
  f.print(R"svg(<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" viewBox="0 0 {} {}" )svg"
          R"svg(font-family="Helvetica, Arial, sans-serif" font-size="12">)svg"
          "\n",
          width, height, width, height);
  f.print(R"svg(<rect width="100%" height="100%" fill="white"/>)svg"
          "\n");
  f.print(R"svg(<text x="{}" y="24" font-size="16" font-weight="bold">{}</text>)svg"
          "\n",
          left, detail::escape(plot.title));
  for (std::size_t k = 0; k < plot.subtitle.size(); ++k) {
    f.print(R"svg(<text x="{}" y="{}" fill="#555">{}</text>)svg"
            "\n",
            left, 42 + 16 * k, detail::escape(plot.subtitle[k]));
  }
  for (const double y : yt) {
    f.print(R"svg(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="#e5e5e5"/>)svg"
            R"svg(<text x="{:.1f}" y="{:.1f}" text-anchor="end" fill="#333">{}</text>)svg"
            "\n",
            left, sy(y), left + pw, sy(y), left - 6, sy(y) + 4, detail::number(y));
  }
  for (const double x : xt) {
    f.print(R"svg(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="#e5e5e5"/>)svg"
            R"svg(<text x="{:.1f}" y="{:.1f}" text-anchor="middle" fill="#333">{}</text>)svg"
            "\n",
            sx(x), top, sx(x), top + ph, sx(x), top + ph + 18, detail::number(x));
  }
  if (plot.zero_line) {
    f.print(R"svg(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="#000"/>)svg"
            "\n",
            left, sy(0), left + pw, sy(0));
  }
  f.print(R"svg(<rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="#333"/>)svg"
          "\n",
          left, top, pw, ph);
  f.print(R"svg(<text x="{:.1f}" y="{}" text-anchor="middle">{}</text>)svg"
          "\n",
          left + pw / 2, height - 18, detail::escape(plot.x_label));
  f.print(R"svg(<text transform="translate(20,{:.1f}) rotate(-90)" text-anchor="middle">{}</text>)svg"
          "\n",
          top + ph / 2, detail::escape(plot.y_label));
  for (std::size_t i = 0; i < plot.lines.size(); ++i) {
    const PlotLine& l = plot.lines[i];
    std::string points;
    for (std::size_t k = 0; k < l.x.size(); ++k) {
      if (std::isfinite(l.y[k])) {
        points += fmt::format("{:.1f},{:.1f} ", sx(l.x[k]), sy(l.y[k]));
      }
    }
    f.print(R"svg(<polyline fill="none" stroke="{}" stroke-width="1.8"{} points="{}"/>)svg"
            "\n",
            l.color, l.dashed ? R"svg( stroke-dasharray="6,4")svg" : "", points);
    const double ly = top + 10 + 20.0 * static_cast<double>(i);
    f.print(R"svg(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="{}" stroke-width="2.5"{}/>)svg"
            R"svg(<text x="{:.1f}" y="{:.1f}">{}</text>)svg"
            "\n",
            left + pw + 14, ly, left + pw + 40, ly, l.color, l.dashed ? R"svg( stroke-dasharray="6,4")svg" : "",
            left + pw + 46, ly + 4, detail::escape(l.label));
  }
  f.print("</svg>\n");
}

} // namespace carve::svg
