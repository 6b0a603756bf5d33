(function(){
  var errs=[];
  window.addEventListener('error',function(e){errs.push(String(e.message));
    document.body.setAttribute('data-viz-errors',errs.join(' | '));});
  function init(){
    var toks=document.querySelectorAll('.tok');
    var info=document.getElementById('viz-info');
    document.addEventListener('mouseover',function(ev){
      var t=ev.target&&ev.target.closest?ev.target.closest('.tok'):null;
      if(!t)return;
      var row=t.closest('.row'),r=row?row.getAttribute('data-reward'):null;
      info.textContent=(r?('reward '+r+'\n'):'')+t.getAttribute('title');
    });
    var box=document.getElementById('viz-stretch');
    box.addEventListener('change',function(){
      document.querySelectorAll('.reward-row.replayed').forEach(function(row){
        var lo=parseFloat(row.getAttribute('data-qmin')),hi=parseFloat(row.getAttribute('data-qmax'));
        row.querySelectorAll('.tok[data-q]').forEach(function(t){
          var a=parseFloat(t.getAttribute('data-alpha'));
          if(box.checked){var q=parseFloat(t.getAttribute('data-q'));a=hi>lo?AMAX*(q-lo)/(hi-lo):0;}
          t.style.backgroundColor=a>0?('rgba('+QRGB+','+a.toFixed(3)+')'):'';
        });
      });
    });
    document.getElementById('viz-stretch-box').style.display='inline';
    if(location.hash==='#stretch'){box.checked=true;box.dispatchEvent(new Event('change'));}
    document.getElementById('viz-status').textContent=toks.length+' token spans';
    document.body.setAttribute('data-viz-tokens',String(toks.length));
    document.body.setAttribute('data-viz-ready','1');
  }
  if(document.readyState==='loading'){document.addEventListener('DOMContentLoaded',init);}else{init();}
})();
